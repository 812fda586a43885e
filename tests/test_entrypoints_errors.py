"""A catalogue of bad HTTP requests: each gets a 4xx with an OpenAI-style body naming the problem,
and none of them stops the server, reaches the engine, or leaks a KV block."""

from __future__ import annotations

import httpx
import pytest

from minilm_engine import LLM
from minilm_engine.course.experiments.server_thread import ServerThread

MODEL = "noodle-apprentice"  # the small one: these tests are about the HTTP layer
GOOD = {"model": MODEL, "prompt": "Order for table 7:\n", "max_tokens": 4, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Two, please."}], "max_tokens": 4}
LONG_PROMPT = "Miso Ramen " * 600  # ~1,800 tokens; the context holds 1,024


def completion(**changes):
    body = {**GOOD, **changes}
    return {k: v for k, v in body.items() if v is not ...}  # `...` deletes a field


def chat(**changes):
    body = {**CHAT, **changes}
    return {k: v for k, v in body.items() if v is not ...}


# (name, method, path, body (dict -> JSON, bytes -> raw), status, words the message must contain, param)
CATALOGUE = [
    ("malformed JSON", "POST", "/v1/completions", b'{"model": "x", "prompt": ', 400, ["not valid JSON"], None),
    ("not UTF-8", "POST", "/v1/completions", b"\xff\xfe{}", 400, ["not valid JSON"], None),
    ("a JSON list", "POST", "/v1/completions", b"[1, 2]", 400, ["JSON object", "list"], None),
    ("model not a string", "POST", "/v1/completions", completion(model=["a", "b"]), 400, ["model"], "model"),
    ("unknown model", "POST", "/v1/completions", completion(model="gpt-9"), 404, ["gpt-9", "does not exist"], "model"),
    ("no prompt", "POST", "/v1/completions", completion(prompt=...), 400, ["prompt", "required"], "prompt"),
    ("empty prompt", "POST", "/v1/completions", completion(prompt=""), 400, ["empty"], "prompt"),
    ("prompt too long", "POST", "/v1/completions", completion(prompt=LONG_PROMPT), 400, ["tokens", "context"], "prompt"),
    ("prompt + max_tokens too long", "POST", "/v1/completions", completion(prompt="Hi", max_tokens=1100), 400,
     ["maximum context length is 1024"], "max_tokens"),
    ("token id outside the vocabulary", "POST", "/v1/completions", completion(prompt=[1, 2, 99999]), 400,
     ["prompt_token_ids", "99999"], "prompt"),
    ("no prompt in the list", "POST", "/v1/completions", completion(prompt=[]), 400, ["empty"], "prompt"),
    ("an empty prompt among several", "POST", "/v1/completions", completion(prompt=["Hi", ""]), 400, ["empty"],
     "prompt"),
    ("a bad id among token lists", "POST", "/v1/completions", completion(prompt=[[1, 2], [3, 99999]]), 400,
     ["prompt_token_ids", "99999"], "prompt"),
    ("a long prompt among several", "POST", "/v1/completions", completion(prompt=["Hi", LONG_PROMPT]), 400,
     ["tokens", "context"], "prompt"),
    ("temperature as a string", "POST", "/v1/completions", completion(temperature="hot"), 400,
     ["temperature", "number"], "temperature"),
    ("negative temperature", "POST", "/v1/completions", completion(temperature=-0.5), 400, ["temperature", ">= 0"],
     "temperature"),
    ("top_p of 0", "POST", "/v1/completions", completion(top_p=0), 400, ["top_p", "(0, 1]"], "top_p"),
    ("negative top_k", "POST", "/v1/completions", completion(top_k=-5), 400, ["top_k"], "top_k"),
    ("max_tokens 0", "POST", "/v1/completions", completion(max_tokens=0), 400, ["max_tokens", ">= 1"], "max_tokens"),
    ("max_tokens not whole", "POST", "/v1/completions", completion(max_tokens=2.5), 400, ["max_tokens"], "max_tokens"),
    ("n = 0", "POST", "/v1/completions", completion(n=0), 400, ["n must be >= 1"], "n"),
    ("n above max_n", "POST", "/v1/completions", completion(n=129), 400, ["n must be <= 128", "max_n"], "n"),
    ("stop as numbers", "POST", "/v1/completions", completion(stop=[1, 2]), 400, ["stop"], "stop"),
    ("empty stop string", "POST", "/v1/completions", completion(stop=[""]), 400, ["stop", "empty"], "stop"),
    ("logprobs above 20", "POST", "/v1/completions", completion(logprobs=21), 400, ["logprobs", "<= 20"], "logprobs"),
    ("negative logprobs", "POST", "/v1/completions", completion(logprobs=-1), 400, ["logprobs", ">= 0"], "logprobs"),
    ("logprobs not whole", "POST", "/v1/completions", completion(logprobs=1.5), 400, ["logprobs"], "logprobs"),
    ("prompt_logprobs above 20", "POST", "/v1/completions", completion(prompt_logprobs=25), 400,
     ["prompt_logprobs", "<= 20"], "prompt_logprobs"),
    ("logit_bias key not a token id", "POST", "/v1/completions", completion(logit_bias={"ramen": 5}), 400,
     ["logit_bias", "token ids"], "logit_bias"),
    ("logit_bias key outside the vocabulary", "POST", "/v1/completions", completion(logit_bias={"99999": 5}), 400,
     ["logit_bias", "99999"], "logit_bias"),
    ("logit_bias value above 100", "POST", "/v1/completions", completion(logit_bias={"5": 101}), 400,
     ["logit_bias", "[-100, 100]"], "logit_bias"),
    ("repetition_penalty 0", "POST", "/v1/completions", completion(repetition_penalty=0), 400,
     ["repetition_penalty", "> 0"], "repetition_penalty"),
    ("presence_penalty above 2", "POST", "/v1/completions", completion(presence_penalty=2.5), 400,
     ["presence_penalty", "[-2, 2]"], "presence_penalty"),
    ("frequency_penalty below -2", "POST", "/v1/completions", completion(frequency_penalty=-3), 400,
     ["frequency_penalty", "[-2, 2]"], "frequency_penalty"),
    ("presence_penalty a word", "POST", "/v1/completions", completion(presence_penalty="high"), 400,
     ["presence_penalty"], "presence_penalty"),
    ("min_p above 1", "POST", "/v1/completions", completion(min_p=1.5), 400, ["min_p", "[0, 1]"], "min_p"),
    ("min_tokens above max_tokens", "POST", "/v1/completions", completion(min_tokens=40, max_tokens=4), 400,
     ["min_tokens", "max_tokens"], "min_tokens"),
    ("negative min_tokens", "POST", "/v1/completions", completion(min_tokens=-1), 400, ["min_tokens", ">= 0"],
     "min_tokens"),
    ("best_of", "POST", "/v1/completions", completion(best_of=3), 400, ["best_of"], "best_of"),
    ("echo as a string", "POST", "/v1/completions", completion(echo="yes"), 400, ["echo"], "echo"),
    ("suffix", "POST", "/v1/completions", completion(suffix="!"), 400, ["suffix", "not supported"], "suffix"),
    # Structured outputs and tools are served (tests/test_structured_outputs.py): what they cannot follow is a 400.
    ("guided_json a bad schema", "POST", "/v1/completions", completion(guided_json={"type": "foo"}), 400,
     ["guided_json", "foo"], "guided_json"),
    ("response_format json_schema without one", "POST", "/v1/completions",
     completion(response_format={"type": "json_schema"}), 400, ["response_format", "json_schema"], "response_format"),
    ("stream_options without stream", "POST", "/v1/completions", completion(stream_options={"include_usage": True}),
     400, ["stream_options", "stream"], "stream_options"),
    ("chat without messages", "POST", "/v1/chat/completions", chat(messages=[]), 400, ["messages"], "messages"),
    ("chat role unknown", "POST", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]), 400,
     ["role"], "messages"),
    ("chat content missing", "POST", "/v1/chat/completions", chat(messages=[{"role": "user"}]), 400,
     ["content", "required"], "messages"),
    ("chat presence_penalty above 2", "POST", "/v1/chat/completions", chat(presence_penalty=3.0), 400,
     ["presence_penalty", "[-2, 2]"], "presence_penalty"),
    ("chat n = 0", "POST", "/v1/chat/completions", chat(n=0), 400, ["n must be >= 1"], "n"),
    ("chat tools with an unknown tool_choice", "POST", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "order"}}], tool_choice="sometimes"), 400,
     ["tool_choice", "sometimes"], "tool_choice"),
    ("chat tool_choice naming a function not in tools", "POST", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "order"}}],
          tool_choice={"type": "function", "function": {"name": "dance"}}), 400, ["dance", "not in tools"],
     "tool_choice"),
    ("chat tool_choice naming a function, no tools", "POST", "/v1/chat/completions",
     chat(tool_choice={"type": "function", "function": {"name": "order"}}), 400, ["tool_choice"], "tool_choice"),
    ("chat functions", "POST", "/v1/chat/completions", chat(functions=[{"name": "order"}]), 400,
     ["functions", "function_call"], "functions"),
    ("chat response_format json_schema", "POST", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}), 400,
     ["response_format", "foo"], "response_format"),
    ("chat top_logprobs above 20", "POST", "/v1/chat/completions", chat(logprobs=True, top_logprobs=21), 400,
     ["logprobs", "<= 20"], "top_logprobs"),
    ("chat top_logprobs without logprobs", "POST", "/v1/chat/completions", chat(top_logprobs=3), 400,
     ["top_logprobs", "logprobs: true"], "top_logprobs"),
    ("chat negative top_logprobs", "POST", "/v1/chat/completions", chat(logprobs=True, top_logprobs=-1), 400,
     ["top_logprobs", ">= 0"], "top_logprobs"),
    ("chat logprobs as a number", "POST", "/v1/chat/completions", chat(logprobs=3), 400, ["logprobs"], "logprobs"),
    ("chat image part", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                 {"type": "image_url", "image_url": {"url": "data:,"}}]}]), 400,
     ["image_url", "not supported", "text"], "messages"),
    ("chat tool message without content", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "tool", "tool_call_id": "a"}]), 400, ["content", "required"], "messages"),
    ("chat custom template", "POST", "/v1/chat/completions", chat(chat_template="{{ 'x' }}"), 400,
     ["chat_template"], "chat_template"),
    ("tokenize neither prompt nor messages", "POST", "/tokenize", {"model": MODEL}, 400, ["prompt", "messages"],
     "prompt"),
    ("tokenize an unknown model", "POST", "/tokenize", {"model": "gpt-9", "prompt": "Hi"}, 404, ["gpt-9"], "model"),
    ("detokenize ids outside the vocabulary", "POST", "/detokenize", {"tokens": [1, 99999]}, 400, ["99999"],
     "tokens"),
    ("detokenize without tokens", "POST", "/detokenize", {"model": MODEL}, 400, ["tokens", "required"], "tokens"),
    ("chat max_tokens and max_completion_tokens", "POST", "/v1/chat/completions",
     chat(max_completion_tokens=5), 400, ["differ", "max_completion_tokens"], "max_tokens"),
    ("GET on a POST route", "GET", "/v1/completions", None, 405, ["not allowed"], None),
    ("unknown route", "POST", "/v1/embeddings", completion(), 404, ["No route", "/v1/embeddings"], None),
]


@pytest.fixture(scope="module")
def server():
    with ServerThread(LLM(MODEL, device="cpu", record_trace=False)) as running:
        yield running


def send(server, method, path, body):
    if isinstance(body, bytes):
        return httpx.request(method, server.url + path, content=body, headers={"content-type": "application/json"})
    return httpx.request(method, server.url + path, json=body)


@pytest.mark.parametrize("name, method, path, body, status, words, param", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_request_gets_a_clear_error(server, name, method, path, body, status, words, param):
    reply = send(server, method, path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], (word, error["message"])
    assert error["param"] == param
    # The server keeps serving, and nothing was left in the engine.
    assert httpx.get(server.url + "/health").status_code == 200
    stats = server.engine.stats
    assert stats.num_running == stats.num_waiting == stats.num_used_blocks == 0


def test_catalogue_is_long_enough_and_the_server_still_answers(server):
    assert len(CATALOGUE) >= 40
    for _, method, path, body, *_ in CATALOGUE:  # all again, back to back
        assert 400 <= send(server, method, path, body).status_code < 500
    reply = httpx.post(server.url + "/v1/completions", json=GOOD)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    assert httpx.post(server.url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert server.engine.step_error is None
    assert server.engine.engine.block_pool.num_used_blocks == 0


def test_a_failing_engine_step_is_a_500_and_the_server_recovers(monkeypatch):
    llm = LLM(MODEL, device="cpu", record_trace=False)
    with ServerThread(llm) as server:
        real_step = llm.engine.step_requests
        calls = {"n": 0}

        def flaky_step():
            calls["n"] += 1
            if calls["n"] <= 2:
                raise RuntimeError("simulated device failure")
            return real_step()

        monkeypatch.setattr(llm.engine, "step_requests", flaky_step)
        broken = httpx.post(server.url + "/v1/completions", json=GOOD)
        assert broken.status_code == 500
        assert broken.json()["error"]["code"] == "engine_error"
        assert "simulated device failure" in broken.json()["error"]["message"]
        streamed = httpx.post(server.url + "/v1/completions", json={**GOOD, "stream": True}).text
        assert '"engine_error"' in streamed and "simulated device failure" in streamed
        assert streamed.rstrip().endswith("data: [DONE]")  # the stream still ends as vLLM's does
        assert server.engine.engine.block_pool.num_used_blocks == 0  # the failed requests were aborted
        assert httpx.post(server.url + "/v1/completions", json=GOOD).json()["usage"]["completion_tokens"] == 4
