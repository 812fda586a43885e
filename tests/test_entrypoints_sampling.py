"""Sampling features over HTTP, read with the official `openai` client and compared with `LLM`.

Echo logprobs equal offline prompt_logprobs (what lm-eval's loglikelihood tasks read); chat
logprobs equal offline logprobs in OpenAI's chat shape; choices of batched prompts x n are
indexed as OpenAI indexes them and are the seeded offline samples; streaming with n > 1 labels
each chunk with its choice; fields that were refused before are honoured now; under mixed
traffic with these fields no KV block stays allocated.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from minilm_engine import LLM, SamplingParams

from test_entrypoints_parsing import MODEL, client, server  # noqa: F401  (fixtures: one server per module)
PROMPTS = ["Order for table 7:\n", "Receipt #7061\n"]
CHAT = [{"role": "user", "content": "Two bowls of Miso Ramen, please."}]


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, device="cpu", record_trace=False)




def no_leak(server) -> None:
    engine = server.engine.engine
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        asyncio.run(asyncio.sleep(0.02))
    assert engine.block_pool.num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_echo_logprobs_are_the_offline_prompt_logprobs(client, server, llm):
    # What lm-eval's local-completions sends for a loglikelihood request.
    answer = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1, temperature=0, logprobs=1,
                                       echo=True, seed=1234)
    (want,) = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1, logprobs=1, prompt_logprobs=1),
                           use_tqdm=False)
    choice, lp = answer.choices[0], answer.choices[0].logprobs
    prompt_ids, output_ids = want.prompt_token_ids, want.outputs[0].token_ids
    assert choice.text == PROMPTS[0] + want.outputs[0].text
    assert len(lp.tokens) == len(prompt_ids) + len(output_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    rows = want.prompt_logprobs[1:] + want.outputs[0].logprobs
    for position, (token_id, row) in enumerate(zip(prompt_ids[1:] + output_ids, rows), start=1):
        assert lp.token_logprobs[position] == pytest.approx(row[token_id].logprob, abs=1e-5)
        assert lp.tokens[position] == llm.tokenizer.decode([token_id])
        assert lp.top_logprobs[position] == pytest.approx({r.decoded_token: r.logprob for r in row.values()}, abs=1e-5)
    # text_offset: where each token's text starts in the echoed text
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    # without echo, logprobs cover the completion only, offsets after the prompt... of the text
    plain = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=2)
    assert len(plain.choices[0].logprobs.tokens) == 3 and plain.choices[0].logprobs.token_logprobs[0] is not None
    no_leak(server)


def test_prompt_logprobs_field_is_vllms(server, llm):
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    reply = httpx.post(server.url + "/v1/completions", json=body).json()
    (want,) = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)
    got = reply["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(want.prompt_token_ids)
    for row, want_row in zip(got[1:], want.prompt_logprobs[1:]):
        assert {int(k): v["rank"] for k, v in row.items()} == {k: v.rank for k, v in want_row.items()}
        for k, v in want_row.items():
            assert row[str(k)]["logprob"] == pytest.approx(v.logprob, abs=1e-5)


def test_chat_logprobs_in_openais_shape(client, server, llm):
    answer = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
                                            top_logprobs=3)
    (want,) = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False)
    content = answer.choices[0].logprobs.content
    assert answer.choices[0].message.content == want.outputs[0].text
    assert len(content) == len(want.outputs[0].token_ids)
    for entry, token_id, row in zip(content, want.outputs[0].token_ids, want.outputs[0].logprobs):
        text = llm.tokenizer.decode([token_id])
        assert entry.token == text and entry.bytes == list(text.encode())
        assert entry.logprob == pytest.approx(row[token_id].logprob, abs=1e-5)
        ranked = sorted(row.values(), key=lambda lp: lp.rank)[:3]
        assert [t.token for t in entry.top_logprobs] == [lp.decoded_token for lp in ranked]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([lp.logprob for lp in ranked], abs=1e-5)
    without = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0)
    assert without.choices[0].logprobs is None


def test_batched_prompts_times_n_are_indexed_as_openai_does(client, server, llm):
    n, seed = 3, 77
    answer = client.completions.create(model=MODEL, prompt=PROMPTS, n=n, seed=seed, max_tokens=6, temperature=1.2)
    assert [c.index for c in answer.choices] == list(range(len(PROMPTS) * n))
    for i, prompt in enumerate(PROMPTS):
        (want,) = llm.generate(prompt, SamplingParams(n=n, seed=seed, max_tokens=6, temperature=1.2), use_tqdm=False)
        for j in range(n):
            assert answer.choices[i * n + j].text == want.outputs[j].text
    # usage counts each prompt once, every sample's tokens
    num_prompt = sum(len(llm.tokenizer.encode(p)) for p in PROMPTS)
    assert answer.usage.prompt_tokens == num_prompt
    no_leak(server)


def test_streaming_with_n_labels_each_choice(client, server):
    n = 3
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], n=n, seed=5, max_tokens=10, temperature=1.0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], n=n, seed=5, max_tokens=10,
                                            temperature=1.0, stream=True))
    texts = {i: "" for i in range(n)}
    for chunk in chunks:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
    assert [texts[i] for i in range(n)] == [c.text for c in whole.choices]
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, n=n, seed=5, max_tokens=8, temperature=1.0)
    stream = list(client.chat.completions.create(model=MODEL, messages=CHAT, n=n, seed=5, max_tokens=8,
                                                 temperature=1.0, stream=True, logprobs=True))
    joined: dict[int, str] = {i: "" for i in range(n)}
    roles: dict[int, int] = {}
    for chunk in stream:
        (choice,) = chunk.choices
        joined[choice.index] += choice.delta.content or ""
        if choice.delta.role:
            roles[choice.index] = roles.get(choice.index, 0) + 1
    assert [joined[i] for i in range(n)] == [c.message.content for c in chat.choices]
    assert roles == {i: 1 for i in range(n)}  # each choice's role once, on its first chunk
    no_leak(server)


def test_fields_refused_before_are_honoured_now(client, server, llm):
    base = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=12, temperature=0)
    plain = client.completions.create(**base).choices[0].text
    cases = [
        ({"presence_penalty": 1.5, "frequency_penalty": 1.0}, dict(presence_penalty=1.5, frequency_penalty=1.0)),
        ({"extra_body": {"repetition_penalty": 1.6}}, dict(repetition_penalty=1.6)),
        ({"extra_body": {"min_tokens": 12, "stop_token_ids": [0]}}, dict(min_tokens=12, stop_token_ids=[0])),
        ({"logit_bias": {"5": 30}}, dict(logit_bias={5: 30.0})),
        ({"extra_body": {"min_p": 0.3}}, dict(min_p=0.3)),
        ({"stop": ["\n"], "extra_body": {"include_stop_str_in_output": True}},
         dict(stop=["\n"], include_stop_str_in_output=True)),
    ]
    changed = 0
    for fields, params in cases:
        got = client.completions.create(**base, **fields).choices[0].text
        (want,) = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, **params), use_tqdm=False)
        assert got == want.outputs[0].text, fields
        changed += got != plain
    assert changed >= 3  # the fields really change answers here (else this test would prove little)
    no_leak(server)


def test_mixed_traffic_with_the_new_fields_leaks_nothing(server):
    bodies = [
        {"prompt": PROMPTS[0], "n": 4, "max_tokens": 8, "logprobs": 3, "echo": True},
        {"prompt": PROMPTS, "n": 2, "max_tokens": 8, "presence_penalty": 0.5, "stream": True},
        {"prompt": PROMPTS[1], "n": 3, "max_tokens": 40, "stream": True, "logprobs": 2},  # left mid-stream
        {"prompt": PROMPTS[1], "max_tokens": 5, "n": 2, "logit_bias": {"99999": 1}},  # a 400
        {"prompt": PROMPTS[0], "max_tokens": 5, "n": 500},  # a 400
        {"prompt": PROMPTS[0], "max_tokens": 6, "prompt_logprobs": 5, "min_tokens": 3},
    ]

    async def one(client: httpx.AsyncClient, body: dict) -> int:
        body = {"model": MODEL, "temperature": 1.0, **body}
        if not body.get("stream"):
            return (await client.post(server.url + "/v1/completions", json=body)).status_code
        async with client.stream("POST", server.url + "/v1/completions", json=body) as response:
            num_lines = 0
            async for line in response.aiter_lines():
                num_lines += line.startswith("data: ")
                if body["max_tokens"] == 40 and num_lines == 3:
                    break  # the client leaves: every sample of its request is aborted
            return response.status_code

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(one(client, b) for b in bodies * 3))

    statuses = asyncio.run(run())
    assert statuses == [200, 200, 200, 400, 400, 200] * 3
    no_leak(server)
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    again = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 3,
                                                             "logprobs": 1, "echo": True})
    assert again.status_code == 200 and json.loads(again.text)["choices"][0]["logprobs"]["token_logprobs"][0] is None


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_logprobs_are_the_whole_answers_even_when_text_is_held_back(client, endpoint):
    # A stop string holds text back for a few tokens; their logprobs must still arrive.
    if endpoint == "chat":
        kwargs = dict(model=MODEL, messages=CHAT, max_tokens=30, temperature=0, logprobs=True, top_logprobs=1,
                      stop=[" is free"])
        whole = client.chat.completions.create(**kwargs)
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        streamed = [e.logprob for k in chunks if k.choices and k.choices[0].logprobs for e in k.choices[0].logprobs.content]
        assert whole.choices[0].finish_reason == "stop"
        assert streamed == [e.logprob for e in whole.choices[0].logprobs.content]
    else:
        kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=30, temperature=0, logprobs=1, stop=["\n"])
        whole = client.completions.create(**kwargs)
        chunks = list(client.completions.create(**kwargs, stream=True))
        streamed = [lp for k in chunks if k.choices[0].logprobs for lp in k.choices[0].logprobs.token_logprobs]
        assert whole.choices[0].finish_reason == "stop"
        assert streamed == whole.choices[0].logprobs.token_logprobs
