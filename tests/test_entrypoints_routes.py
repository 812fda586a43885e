"""Routes and names as vLLM has them, and batched prompts, through a real server.

/v1/models entries carry root, parent and max_model_len; the served name is the model as given
(several with --served-model-name a b); /tokenize, /detokenize and /version answer as vLLM's do;
a streamed chat's role arrives with its first token; /v1/completions takes a list of prompts or
of token-id lists (lm-evaluation-harness sends `prompt=[[ids]]`), one choice per prompt, each
the answer that prompt gets alone, and a client that leaves frees every prompt's blocks.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from minilm_engine import LLM, SamplingParams, __version__
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.entrypoints.cli.main import build_parser
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.model.loader import CHECKPOINTS_DIR
from test_entrypoints_parsing import MODEL, client, server  # noqa: F401  (fixtures: one server per module)

PROMPTS = ["Order for table 7:\n", "Receipt #7061\n", "Shop diary, 12 March\n"]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Two bowls, please."}], "max_tokens": 10,
        "temperature": 0}


@pytest.fixture(scope="module")
def llm():
    """The reference: each prompt alone."""
    return BaselineLLM(MODEL, device="cpu", strategy="kv_cache")


def alone(llm, prompt, max_tokens):
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return out.outputs[0]


def no_leak(server, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while server.engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.engine.engine.has_unfinished_requests()
    assert server.engine.engine.block_pool.num_used_blocks == 0


# -- names ----------------------------------------------------------------------------------


def test_models_entries_carry_root_parent_and_max_model_len(server):
    (card,) = httpx.get(server.url + "/v1/models").json()["data"]
    assert card["id"] == card["root"] == MODEL
    assert card["parent"] is None and card["max_model_len"] == server.engine.max_model_len == 1024
    assert card["object"] == "model" and isinstance(card["created"], int)


def test_one_model_by_its_id_and_a_request_that_names_none(server):
    card = httpx.get(server.url + f"/v1/models/{MODEL}").json()
    assert card["id"] == card["root"] == MODEL and card["max_model_len"] == server.engine.max_model_len
    missing = httpx.get(server.url + "/v1/models/gpt-9")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert "gpt-9" in missing.json()["error"]["message"]
    # `model` is optional, as in vLLM: the answer names the server's first served model
    reply = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert reply.status_code == 200 and reply.json()["model"] == MODEL
    chat = httpx.post(server.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert chat.status_code == 200 and chat.json()["model"] == MODEL


def test_cors_as_vllm_spells_it():
    parser = build_parser()
    args = parser.parse_args(["serve", MODEL, "--allowed-origins", '["http://localhost:3000"]',
                              "--allow-credentials"])
    assert args.allowed_origins == ["http://localhost:3000"] and args.allow_credentials
    assert parser.parse_args(["serve", MODEL]).allowed_origins == ["*"]
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", MODEL, "--allowed-origins", "http://localhost:3000"])  # not JSON
    from minilm_engine.entrypoints.openai.api_server import CORSOptions

    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with ServerThread(LLM(MODEL, device="cpu", record_trace=False), api_key="k",
                      cors=CORSOptions(allowed_origins=["http://localhost:3000"])) as server:
        # the preflight carries no key: answered by the CORS layer, not refused with a 401
        ok = httpx.options(server.url + "/v1/completions", headers=preflight)
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = httpx.options(server.url + "/v1/completions", headers={**preflight, "Origin": "http://evil.test"})
        assert "access-control-allow-origin" not in other.headers
        assert httpx.get(server.url + "/v1/models").status_code == 401  # the key is still required


def test_the_served_name_is_the_model_as_given_not_its_folder():
    given = str(CHECKPOINTS_DIR / MODEL)  # a folder path: vLLM serves the string, so do we
    with ServerThread(LLM(given, device="cpu", record_trace=False)) as server:
        (card,) = httpx.get(server.url + "/v1/models").json()["data"]
        assert card["id"] == card["root"] == given
        reply = httpx.post(server.url + "/v1/completions", json={"model": given, "prompt": "Hi", "max_tokens": 2})
        assert reply.status_code == 200 and reply.json()["model"] == given
        assert httpx.post(server.url + "/v1/completions",
                          json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}).status_code == 404


def test_several_served_model_names_as_vllm_spells_them():
    parser = build_parser()
    assert parser.parse_args(["serve", MODEL, "--served-model-name", "a", "b"]).served_model_name == ["a", "b"]
    assert parser.parse_args(["serve", MODEL, "--served-model-name", "a", "--served-model-name", "b"]
                             ).served_model_name == ["a", "b"]
    assert parser.parse_args(["serve", "--served-model-name", "a", "b", "--", MODEL]).model == MODEL
    with ServerThread(LLM(MODEL, device="cpu", record_trace=False), served_model_names=["waiter", "sam"]) as server:
        cards = httpx.get(server.url + "/v1/models").json()["data"]
        assert [c["id"] for c in cards] == ["waiter", "sam"] and {c["root"] for c in cards} == {MODEL}
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for name in ("waiter", "sam"):
            assert client.completions.create(model=name, prompt="Hi", max_tokens=2).model == name


# -- tokenize, detokenize, version ----------------------------------------------------------


def test_tokenize_counts_what_a_completion_counts(server, client, llm):
    for prompt in PROMPTS:
        reply = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": prompt}).json()
        assert reply["tokens"] == llm.tokenizer.encode(prompt)
        assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] == 1024
        assert reply["token_strs"] is None
        usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
        assert usage.prompt_tokens == reply["count"]
        back = httpx.post(server.url + "/detokenize", json={"model": MODEL, "tokens": reply["tokens"]}).json()
        assert back == {"prompt": prompt}
    with_strs = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[0], "return_token_strs": True}).json()
    assert with_strs["token_strs"] == llm.tokenizer.convert_ids_to_tokens(with_strs["tokens"])


def test_tokenize_messages_uses_the_chat_template(server, client):
    reply = httpx.post(server.url + "/tokenize", json={"model": MODEL, "messages": CHAT["messages"]}).json()
    assert reply["count"] == client.chat.completions.create(**CHAT).usage.prompt_tokens
    text = httpx.post(server.url + "/detokenize", json={"tokens": reply["tokens"]}).json()["prompt"]
    assert text == "Ana: Two bowls, please.\nSam:"


def test_tokenizer_info_as_lm_eval_reads_it(server, llm):
    """vLLM's /tokenizer_info: lm-evaluation-harness tokenizes through the server when it
    answers with an eos_token (and /tokenize works), encoding special tokens as /tokenize does."""
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == info["bos_token"] == "<|endoftext|>" and info["model_max_length"] == 1024
    assert info["tokenizer_class"] == type(llm.tokenizer).__name__
    assert info["added_tokens_decoder"] == {"0": "<|endoftext|>"}
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)
    # The template /v1/chat/completions renders with, so a client renders the same prompt.
    from jinja2 import Template
    messages = [{"role": "user", "content": "Two bowls, please."}]
    rendered = Template(info["chat_template"]).render(messages=messages, add_generation_prompt=True)
    asked = httpx.post(server.url + "/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert llm.tokenizer.encode(rendered, add_special_tokens=True) == asked["tokens"]
    eos = httpx.post(server.url + "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False})
    assert eos.json()["tokens"] == [llm.tokenizer.eos_token_id]


def test_version(server):
    assert httpx.get(server.url + "/version").json() == {"version": __version__}


# -- the chat role chunk ----------------------------------------------------------------------


def test_the_chat_role_arrives_with_the_first_token(server, llm):
    prompt = "Ana: Two bowls, please.\nSam:"
    want = alone(llm, prompt, 10)
    events = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    first = events[0]["choices"][0]["delta"]
    # The first event a client sees already holds generated text: it comes after the prefill.
    assert first["role"] == "assistant" and first["content"] and want.text.startswith(first["content"])
    assert all(e["choices"][0]["delta"]["role"] is None for e in events[1:])
    assert "".join(e["choices"][0]["delta"]["content"] or "" for e in events) == want.text.split("\n")[0]


def test_a_chat_that_stops_before_any_text_still_names_the_role(server):
    # A stop string at the very start of the answer: no text at all, the role still comes.
    body = {**CHAT, "stream": True, "stop": [" "], "max_tokens": 5}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# -- batched prompts ------------------------------------------------------------------------


def test_a_list_of_prompts_gets_one_choice_each(client, llm, server):
    answer = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    for choice, prompt in zip(answer.choices, PROMPTS):
        want = alone(llm, prompt, 12)
        assert choice.text == want.text and choice.finish_reason == want.finish_reason
    assert answer.usage.prompt_tokens == sum(len(llm.tokenizer.encode(p)) for p in PROMPTS)
    assert answer.usage.completion_tokens == sum(len(alone(llm, p, 12).token_ids) for p in PROMPTS)
    no_leak(server)


def test_token_id_lists_as_lm_eval_sends_them(server, llm):
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    # lm-evaluation-harness local-completions, generate_until, tokenized_requests=True (its default).
    body = {"model": MODEL, "prompt": ids, "max_tokens": 12, "temperature": 0, "stop": ["\n\n"], "seed": 1234}
    reply = httpx.post(server.url + "/v1/completions", json=body).json()
    assert [c["text"] for c in reply["choices"]] == [alone(llm, p, 12).text.split("\n\n")[0] for p in PROMPTS]
    one = httpx.post(server.url + "/v1/completions", json={**body, "prompt": [ids[1]]}).json()
    assert [c["index"] for c in one["choices"]] == [0] and one["choices"][0]["text"] == reply["choices"][1]["text"]
    flat = httpx.post(server.url + "/v1/completions", json={**body, "prompt": ids[1]}).json()
    assert flat["choices"] == one["choices"]


def test_streamed_prompts_interleave_by_index(server, llm):
    body = {"model": MODEL, "prompt": PROMPTS, "max_tokens": 12, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    texts, reasons = {}, {}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    for event in events[:-1]:
        (choice,) = event["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"] is not None:
            reasons[choice["index"]] = choice["finish_reason"]
    assert texts == {i: alone(llm, p, 12).text for i, p in enumerate(PROMPTS)}
    assert reasons == {i: alone(llm, p, 12).finish_reason for i, p in enumerate(PROMPTS)}
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == sum(len(alone(llm, p, 12).token_ids) for p in PROMPTS)
    no_leak(server)


def test_a_client_that_leaves_a_batched_stream_frees_every_prompt(server):
    before = server.engine.stats.num_aborted
    body = {"model": MODEL, "prompt": PROMPTS, "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def leave_after_three_chunks():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", server.url + "/v1/completions", json=body) as reply:
                num_chunks = 0
                async for line in reply.aiter_lines():
                    num_chunks += line.startswith("data: {")
                    if num_chunks == 3:
                        return

    asyncio.run(leave_after_three_chunks())
    no_leak(server)
    assert server.engine.stats.num_aborted == before + len(PROMPTS)
