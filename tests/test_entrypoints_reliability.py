"""The server under load with clients that leave: a KV pool too small for everyone (preemptions
happen), 64 concurrent streaming clients of which some disconnect mid-stream or before their
first token.  Every finished answer must equal the same request served undisturbed, every request
whose client left must be aborted (and only those), the pool must be entirely free at the end,
and the server must still answer."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.experiments.server_thread import ServerThread

NUM_CLIENTS = 64
MAX_TOKENS = 24
MODEL = "noodle-chef"


@pytest.fixture(scope="module")
def server():
    # 16 running requests of ~35 tokens need ~80 blocks of 8; the pool has 40: preemption.
    llm = LLM(MODEL, device="cpu", record_trace=False, max_num_seqs=16, block_size=8, num_kv_blocks=40)
    with ServerThread(llm) as running:
        ended: list[tuple[str, str | None]] = []  # (request id, finish reason), engine thread
        observe = running.engine.on_request_end
        running.engine.on_request_end = lambda r: (ended.append((r.request_id, r.finish_reason)), observe(r))
        running.ended = ended
        yield running


async def one_client(client: httpx.AsyncClient, url: str, prompt: str, behaviour: str, k: int) -> dict:
    """behaviour: "finish" reads everything; "leave_early" closes right after the headers (the
    request is in the engine, no token read yet); "leave_mid" closes after k text chunks."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    out = {"prompt": prompt, "behaviour": behaviour, "text": "", "finish_reason": None}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200
        out["id"] = response.headers["x-request-id"]
        if behaviour == "leave_early":
            return out  # leaving the block closes the connection
        num_chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            out["text"] += choice["text"]
            out["finish_reason"] = choice["finish_reason"]
            num_chunks += 1
            if behaviour == "leave_mid" and num_chunks == k:
                return out
    return out


async def traffic(url: str, prompts: list[str], behaviours: list[str], rng: random.Random) -> list[dict]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = []
        for prompt, behaviour in zip(prompts, behaviours):
            tasks.append(asyncio.create_task(one_client(client, url, prompt, behaviour, rng.randint(1, 4))))
            await asyncio.sleep(rng.uniform(0, 0.01))  # arrivals spread a little, not all at once
        return await asyncio.gather(*tasks)


def wait_until_idle(server, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = server.engine.stats
        if stats.num_running == stats.num_waiting == 0 and len(server.ended) >= NUM_CLIENTS:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server did not settle: {server.engine.stats}")


def test_disconnects_under_preemption_leak_nothing_and_change_no_answer(server):
    rng = random.Random(11)
    prompts = sample_prompts(NUM_CLIENTS, seed=3)
    behaviours = rng.choices(["finish", "leave_early", "leave_mid"], weights=[6, 2, 2], k=NUM_CLIENTS)
    results = asyncio.run(traffic(server.url, prompts, behaviours, rng))
    wait_until_idle(server)

    # The reference: the same requests offline, with room for all (no preemption, nobody
    # leaving); the engine's own tests prove that batched equals one at a time.
    reference = LLM(MODEL, device="cpu", max_num_seqs=NUM_CLIENTS, record_trace=False)
    alone = reference.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    ended = dict(server.ended)
    left = {r["id"] for r in results if r["finish_reason"] is None}
    finished = [(r, a) for r, a in zip(results, alone) if r["finish_reason"] is not None]

    # The hard paths really ran.
    assert server.engine.stats.num_preemptions >= 5
    assert len(left) >= 10 and len(finished) >= 20
    # Every answer that finished is the answer it gets alone.
    for result, want in finished:
        assert result["text"] == want.outputs[0].text, result["prompt"]
        assert result["finish_reason"] == want.outputs[0].finish_reason
    # Every request whose client left was aborted, unless it had already ended when the server
    # saw the client go (a fast step can finish a short answer first); no other was aborted.
    assert len(ended) == NUM_CLIENTS
    aborted = {rid for rid, reason in ended.items() if reason == "abort"}
    assert aborted <= left
    assert all(ended[rid] in ("abort", "stop", "length") for rid in left)
    assert len(aborted) >= len(left) // 2  # the abort path really ran, for most who left
    assert server.engine.stats.num_aborted == len(aborted)
    # Nothing leaked, and the server still serves.
    assert server.engine.engine.block_pool.num_used_blocks == 0
    assert server.engine.engine.get_num_unfinished_requests() == 0
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    again = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": prompts[0],
                                                             "max_tokens": MAX_TOKENS, "temperature": 0})
    assert again.json()["choices"][0]["text"] == alone[0].outputs[0].text


def test_a_non_streamed_request_is_aborted_when_its_client_times_out(server):
    before = server.engine.stats.num_aborted
    # 300 tokens (what the 320-slot KV budget holds) take ~0.6 s alone on a 2-core CPU (2026-12-04;
    # 250 took 0.53 s, at the old 0.5 s timeout): a 0.1 s read timeout leaves the client gone long
    # before the answer, on a faster machine too.
    body = {"model": MODEL, "prompt": "Receipt #1\n", "max_tokens": 300, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.1))
    deadline = time.monotonic() + 10
    while server.engine.stats.num_aborted == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.stats.num_aborted == before + 1
    assert server.engine.stats.num_used_blocks == 0


def test_shutdown_aborts_what_is_in_flight_and_frees_every_block():
    llm = LLM("noodle-apprentice", device="cpu", record_trace=False)
    server = ServerThread(llm, shutdown_timeout=0.5).start()
    body = {"model": "noodle-apprentice", "prompt": "Receipt #1\n", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}

    async def hold_streams() -> list[str]:
        async with httpx.AsyncClient(timeout=30) as client:
            async def read(i):
                reasons = []
                try:
                    async with client.stream("POST", server.url + "/v1/completions", json=body) as response:
                        async for line in response.aiter_lines():
                            if line.startswith("data: {"):
                                reasons.append(json.loads(line[6:])["choices"][0]["finish_reason"])
                except httpx.HTTPError:
                    pass  # the server may close the connection on its way down
                return reasons[-1] if reasons else None

            tasks = [asyncio.create_task(read(i)) for i in range(4)]
            while server.engine.stats.num_running < 4:
                await asyncio.sleep(0.02)
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            return await asyncio.gather(*tasks)

    reasons = asyncio.run(hold_streams())
    assert not server.engine.is_running
    assert llm.engine.block_pool.num_used_blocks == 0 and not llm.engine.has_unfinished_requests()
    assert server.engine.stats.num_aborted == 4
    assert all(reason in ("abort", None) for reason in reasons)


def test_n_samples_with_logprobs_under_preemption_and_disconnects_leak_nothing(server):
    # Issue 19's fields on the preempting server: n = 3 samples per request (each an engine
    # request of its own), logprobs, echo; a third of the clients leave mid-stream.
    rng = random.Random(5)
    n, num_clients = 3, 12
    prompts = sample_prompts(num_clients, seed=8)
    leaving = set(rng.sample(range(num_clients), num_clients // 3))
    already_ended = len(server.ended)

    async def one(client: httpx.AsyncClient, i: int) -> dict:
        body = {"model": MODEL, "prompt": prompts[i], "max_tokens": MAX_TOKENS, "temperature": 0, "n": n,
                "logprobs": 2, "echo": i % 2 == 0, "stream": True}
        texts, finish, num_chunks = {j: "" for j in range(n)}, {}, 0
        async with client.stream("POST", server.url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                (choice,) = json.loads(line[6:])["choices"]
                texts[choice["index"]] += choice["text"]
                finish[choice["index"]] = choice["finish_reason"]
                num_chunks += 1
                if i in leaving and num_chunks == 4:
                    break
        return {"texts": texts, "finish": finish, "echo": body["echo"]}

    async def run() -> list[dict]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(num_clients)))

    before_preemptions = server.engine.stats.num_preemptions
    results = asyncio.run(run())
    deadline = time.monotonic() + 30
    while len(server.ended) < already_ended + n * num_clients and time.monotonic() < deadline:
        time.sleep(0.05)
    reference = LLM(MODEL, device="cpu", max_num_seqs=num_clients, record_trace=False)
    alone = reference.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert server.engine.stats.num_preemptions > before_preemptions  # the hard path ran
    for i, (result, want) in enumerate(zip(results, alone)):
        if i in leaving:
            continue
        for j in range(n):
            text = (prompts[i] if result["echo"] else "") + want.outputs[0].text
            assert result["texts"][j] == text and result["finish"][j] == want.outputs[0].finish_reason
    new_ends = server.ended[already_ended:]
    assert len(new_ends) == n * num_clients
    aborted = {rid for rid, reason in new_ends if reason == "abort"}
    assert 0 < len(aborted) <= n * len(leaving)
    assert server.engine.engine.block_pool.num_used_blocks == 0
    assert server.engine.engine.get_num_unfinished_requests() == 0
