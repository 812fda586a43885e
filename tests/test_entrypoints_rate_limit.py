"""Rate limits on the real server, counted in tokens: a fake clock stands still (or moves by
hand), so what passes depends only on what the requests cost.

Many small requests pass where as many huge ones are refused; a 429 carries OpenAI's body and
headers with the right numbers, does no engine work and holds no block; a finished request is
settled to its real usage, an aborted one to what it computed; other keys are unaffected; a keys
file admits only its keys (401 otherwise) and a bad one stops `serve` with the reason.
"""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from minilm_engine import LLM
from minilm_engine.entrypoints.cli.main import main
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimits

MODEL = "noodle-chef"
TPM = 600
SMALL = "Receipt #1\n"
HUGE = "The Golden Bowl serves miso ramen, shoyu ramen and tonkotsu ramen every day. " * 6


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def served():
    clock = Clock()
    limiter = RateLimiter(RateLimits(requests_per_minute=1000, tokens_per_minute=TPM), clock=clock)
    llm = LLM(MODEL, device="cpu", record_trace=False)
    with ServerThread(llm, rate_limiter=limiter) as server:
        server.clock, server.limiter = clock, limiter
        yield server


def post(server, key: str, prompt: str, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": server.engine.llm.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **extra}
    return httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def num_tokens(server, prompt: str) -> int:
    return len(server.engine.llm.tokenizer.encode(prompt, add_special_tokens=True))


def test_many_small_requests_pass_where_as_many_huge_ones_are_limited(served):
    small_cost, huge_cost = num_tokens(served, SMALL) + 4, num_tokens(served, HUGE) + 100
    num_requests = 8
    assert num_requests * small_cost <= TPM < 3 * huge_cost  # the premise: same count, other costs
    small = [post(served, "small-key", SMALL, 4).status_code for _ in range(num_requests)]
    # ignore_eos: every huge request really uses its 100 tokens, so nothing is settled back
    huge = [post(served, "huge-key", HUGE, 100, ignore_eos=True).status_code for _ in range(num_requests)]
    assert small == [200] * num_requests
    assert huge == [200] * (TPM // huge_cost) + [429] * (num_requests - TPM // huge_cost)


def test_a_429_has_openai_body_and_headers_with_the_right_numbers(served):
    key, cost = "headers-key", num_tokens(served, HUGE) + 200
    first = post(served, key, HUGE, 200, ignore_eos=True)
    assert first.status_code == 200
    h = first.headers  # right after this request's reservation
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == (str(TPM), str(TPM - cost))
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("1000", "999")
    assert h["x-ratelimit-reset-tokens"] == f"{cost / (TPM / 60):g}s"
    second = post(served, key, HUGE, 250)
    assert second.status_code == 429
    error = second.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens"
    wanted = num_tokens(served, HUGE) + 250
    wait = (wanted - (TPM - cost)) / (TPM / 60)
    assert f"Limit {TPM}, Used {cost}, Requested {wanted}" in error["message"]
    assert second.headers["retry-after"] == str(math.ceil(wait))
    assert second.headers["x-ratelimit-remaining-tokens"] == str(TPM - cost)
    served.clock.now += wait  # the bucket refills while the client waits as told
    assert post(served, key, HUGE, 250).status_code == 200


def test_a_limited_request_does_no_engine_work_and_holds_no_block(served):
    engine = served.engine.engine
    post(served, "work-key", HUGE, 100, ignore_eos=True)
    assert post(served, "work-key", HUGE, 400).status_code == 429
    steps, ended = engine.num_steps, served.engine.stats.num_aborted
    for _ in range(5):
        assert post(served, "work-key", HUGE, 400, stream=True).status_code == 429
    assert engine.num_steps == steps and served.engine.stats.num_aborted == ended
    scraped = httpx.get(served.url + "/metrics").text
    refused = [line for line in scraped.splitlines()
               if line.startswith("minilm:num_requests_rate_limited_total") and 'limit="tokens"' in line]
    assert len(refused) == 1 and float(refused[0].rsplit(" ", 1)[1]) >= 6  # counted, never run
    assert engine.block_pool.num_used_blocks == 0 and not engine.requests
    assert post(served, "other-key", SMALL, 4).status_code == 200  # other keys are unaffected


def test_a_finished_request_is_settled_to_its_real_usage(served):
    key = "settle-key"
    reply = post(served, key, SMALL, 300)  # reserves 300 output tokens; the answer stops sooner
    usage = reply.json()["usage"]
    assert reply.status_code == 200 and usage["completion_tokens"] < 300  # the refund path ran
    remaining = served.limiter.status(key).tokens.remaining
    assert remaining == TPM - usage["prompt_tokens"] - usage["completion_tokens"]


def test_an_aborted_stream_is_charged_what_it_computed_not_its_reservation(served):
    key, max_tokens = "abort-key", 400
    body = {"model": MODEL, "prompt": SMALL, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first token
    reserved_left = TPM - num_tokens(served, SMALL) - max_tokens
    deadline = time.monotonic() + 30
    while served.limiter.status(key).tokens.remaining == reserved_left and time.monotonic() < deadline:
        time.sleep(0.05)  # the server notices the disconnect, aborts, settles
    assert served.limiter.status(key).tokens.remaining > reserved_left
    pool = served.engine.engine.block_pool
    while pool.num_used_blocks and time.monotonic() < deadline:
        time.sleep(0.05)  # the abort is applied at the engine thread's next turn
    assert pool.num_used_blocks == 0


def test_with_a_keys_file_unknown_keys_are_401_and_known_ones_have_their_own_limits():
    limiter = RateLimiter(keys={"sk-a": RateLimits(tokens_per_minute=40), "sk-b": RateLimits()}, clock=Clock())
    with ServerThread(LLM("noodle-apprentice", device="cpu", record_trace=False), rate_limiter=limiter) as server:
        assert post(server, "sk-nope", SMALL, 4).status_code == 401
        assert httpx.post(server.url + "/v1/completions", json={"prompt": SMALL}).status_code == 401
        assert post(server, "sk-a", SMALL, 4).status_code == 200
        assert post(server, "sk-a", SMALL, 30).status_code == 429
        assert post(server, "sk-b", SMALL, 30).status_code == 200  # unlimited
        assert httpx.get(server.url + "/health").status_code == 200  # no key needed


def test_serve_refuses_a_keys_file_that_does_not_parse(tmp_path, capsys):
    path = tmp_path / "keys.json"
    path.write_text('{"sk-a": {"tokens_per_minute": "many"}}')
    assert main(["serve", "noodle-apprentice", "--device", "cpu", "--api-keys-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "'sk-a'" in err and "tokens_per_minute" in err
    path.write_text(json.dumps({"sk-a": {}}))
    assert main(["serve", "--api-keys-file", str(path), "--api-key", "x"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["serve", "--rate-limit-tpm", "0"]) == 2
    assert "--rate-limit-tpm" in capsys.readouterr().err
    assert main(["serve", "--rate-limit-tpm", "10", "--rate-limit-period", "0"]) == 2
    assert "--rate-limit-period" in capsys.readouterr().err


def test_chat_and_multi_prompt_completions_are_limited_by_what_they_reserve(served):
    key = "multi-key"
    body = {"model": MODEL, "prompt": [SMALL, SMALL, SMALL], "max_tokens": 100, "temperature": 0, "ignore_eos": True}
    reply = httpx.post(served.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                       timeout=60)
    assert reply.status_code == 200
    left = TPM - 3 * (num_tokens(served, SMALL) + 100)  # one request, three prompts' reservations
    assert reply.headers["x-ratelimit-remaining-tokens"] == str(left)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Two, please."}], "max_tokens": left + 50}
    refused = httpx.post(served.url + "/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"},
                         timeout=60)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "retry-after" in refused.headers  # it fits the limit, not what is left of it now
    chat["max_tokens"] = 5
    answered = httpx.post(served.url + "/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"},
                          timeout=60)
    assert answered.status_code == 200 and "x-ratelimit-remaining-tokens" in answered.headers


def test_a_request_the_server_failed_is_refunded(monkeypatch):
    limiter = RateLimiter(RateLimits(requests_per_minute=10, tokens_per_minute=TPM), clock=Clock())
    llm = LLM("noodle-apprentice", device="cpu", record_trace=False)
    with ServerThread(llm, rate_limiter=limiter) as server:
        real_step, calls = llm.engine.step_requests, []

        def failing_once():
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("simulated device failure")
            return real_step()

        monkeypatch.setattr(llm.engine, "step_requests", failing_once)
        assert post(server, "k", SMALL, 20).status_code == 500
        status = limiter.status("k")
        assert (status.tokens.remaining, status.requests.remaining) == (TPM, 10)  # all back
        assert post(server, "k", SMALL, 20).status_code == 200
        assert limiter.status("k").requests.remaining == 9
