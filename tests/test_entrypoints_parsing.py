"""Lenient, honest parsing, as vLLM parses: through a real server, with the official client.

Unknown fields are ignored (the answer is the one without them) and logged once per field name;
`null` is the default everywhere; known fields whose value the engine cannot honour are a 400
naming the field, and their neutral values are accepted; chat content may be a list of text
parts; `stream_options.continuous_usage_stats` puts the usage on every chunk.  No request of
these leaves a KV block behind.
"""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from minilm_engine import LLM
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.entrypoints.openai.protocol import warn_ignored

MODEL = "noodle-apprentice"
PROMPT = "Order for table 7:\n"
BASE = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Two bowls of Miso Ramen, please."}],
        "max_tokens": 12, "temperature": 0}
PROTOCOL_LOGGER = "minilm_engine.entrypoints.openai.protocol"


@pytest.fixture(scope="module")
def server():
    with ServerThread(LLM(MODEL, device="cpu", record_trace=False)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, path, body):
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def no_leak(server):
    engine = server.engine
    assert engine.engine.block_pool.num_used_blocks == 0
    assert not engine.engine.has_unfinished_requests()


def stream_events(server, path, body) -> list[dict]:
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as reply:
        assert reply.status_code == 200
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_unknown_fields_are_ignored_and_logged_once_per_name(server, caplog):
    plain = post(server, "/v1/completions", BASE)
    extras = {"x_test_metadata": {"who": "a test"}, "x_test_store": False,
              "stream": True, "stream_options": {"include_usage": True, "x_test_nested": 1}}
    with caplog.at_level(logging.WARNING, logger=PROTOCOL_LOGGER):
        for _ in range(3):
            events = stream_events(server, "/v1/completions", {**BASE, **extras})
            assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == plain["choices"][0]["text"]
    warned = [r.getMessage() for r in caplog.records if r.name == PROTOCOL_LOGGER]
    for name in ("x_test_metadata", "x_test_store", "stream_options.x_test_nested"):
        assert sum(f"'{name}'" in message for message in warned) == 1, (name, warned)
    assert warn_ignored(["x_test_store"]) == []  # already warned: not again, process-wide
    no_leak(server)


def test_the_official_client_extra_body_and_chat_message_extras(client, server, caplog):
    want = client.chat.completions.create(**CHAT).choices[0].message.content
    messages = [{"role": "user", "content": CHAT["messages"][0]["content"], "x_test_cache_hint": "ephemeral"}]
    with caplog.at_level(logging.WARNING, logger=PROTOCOL_LOGGER):
        got = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, metadata={"run": "test"}, store=False,
            extra_body={"x_test_priority": 3}).choices[0].message.content
    assert got == want
    warned = " ".join(r.getMessage() for r in caplog.records if r.name == PROTOCOL_LOGGER)
    assert "'messages[].x_test_cache_hint'" in warned and "'x_test_priority'" in warned


def test_null_means_the_default_everywhere(server):
    defaults = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": 0})
    nulls = {name: None for name in ("max_tokens", "n", "stop", "stream", "stream_options", "seed", "top_p",
                                     "top_k", "ignore_eos", "presence_penalty", "frequency_penalty", "logit_bias",
                                     "logprobs", "echo", "suffix", "user", "best_of", "min_p", "response_format")}
    answer = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": 0, **nulls})
    assert answer["choices"] == defaults["choices"]
    assert answer["usage"]["completion_tokens"] == defaults["usage"]["completion_tokens"] <= 16  # max_tokens: 16
    chat = post(server, "/v1/chat/completions", CHAT)
    chat_nulls = post(server, "/v1/chat/completions", {
        **CHAT, "messages": [{**CHAT["messages"][0], "name": None}], "max_completion_tokens": None, "tools": None,
        "tool_choice": None, "functions": None, "response_format": None, "top_logprobs": None,
        "chat_template_kwargs": None, "stream_options": None})
    assert chat_nulls["choices"] == chat["choices"]
    no_leak(server)


def test_numbers_are_parsed_as_leniently_as_vllm_parses_them(server):
    plain = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": 6,
                                             "top_k": 5, "seed": 3, "presence_penalty": 0.5})
    lenient = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": "0", "max_tokens": 6.0,
                                               "top_k": "5", "seed": "3", "presence_penalty": "0.5"})
    assert lenient["choices"] == plain["choices"]
    no_leak(server)


def test_neutral_values_of_unimplemented_fields_are_accepted(client, server):
    want = client.completions.create(**BASE).choices[0].text
    got = client.completions.create(**BASE, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, echo=False,
                                    best_of=1, logprobs=0, extra_body={
                                        "repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0,
                                        "skip_special_tokens": True, "include_stop_str_in_output": False,
                                        "response_format": {"type": "text"}, "top_k": -1}).choices[0].text
    assert got == want
    chat_want = client.chat.completions.create(**CHAT).choices[0].message.content
    tools = [{"type": "function", "function": {"name": "order", "parameters": {"type": "object"}}}]
    chat_got = client.chat.completions.create(**CHAT, tools=tools, tool_choice="none", parallel_tool_calls=False,
                                              response_format={"type": "text"}, logprobs=False, top_logprobs=0,
                                              extra_body={"add_generation_prompt": True})
    assert chat_got.choices[0].message.content == chat_want
    assert client.chat.completions.create(**CHAT, tool_choice="auto").choices[0].message.content == chat_want
    # guidellm sends both limits, equal.
    both = client.chat.completions.create(**CHAT, max_completion_tokens=CHAT["max_tokens"])
    assert both.choices[0].message.content == chat_want


@pytest.mark.parametrize("endpoint, changes, param", [
    ("completions", {"extra_body": {"best_of": 2}}, "best_of"),
    ("completions", {"suffix": "!"}, "suffix"),
    ("completions", {"extra_body": {"bad_words": ["ramen"]}}, "bad_words"),
    ("chat", {"tool_choice": "required"}, "tool_choice"),  # (tools are served: tests/test_structured_outputs.py)
    ("chat", {"extra_body": {"allowed_token_ids": [1, 2]}}, "allowed_token_ids"),
    # (response_format and structured_outputs are implemented: tests/test_structured_outputs.py)
])
def test_what_would_change_the_output_is_a_400_naming_the_field(client, server, endpoint, changes, param):
    create = client.completions.create if endpoint == "completions" else client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as e:
        create(**(BASE if endpoint == "completions" else CHAT), **changes)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and param in e.value.body["message"]
    assert e.value.body["type"] == "invalid_request_error"
    no_leak(server)


def test_chat_content_as_text_parts(client):
    text = CHAT["messages"][0]["content"]
    want = client.chat.completions.create(**CHAT).choices[0].message.content
    parts = [{"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]
    got = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=12,
                                         temperature=0)
    assert got.choices[0].message.content == want
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}])
    assert "input_audio" in e.value.body["message"] and e.value.body["param"] == "messages"


@pytest.mark.parametrize("path, body", [("/v1/completions", {**BASE, "ignore_eos": True}),
                                        ("/v1/chat/completions", {**CHAT, "ignore_eos": True})])
def test_continuous_usage_stats_puts_usage_on_every_chunk(server, path, body):
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = stream_events(server, path, {**body, "stream": True, "stream_options": options})
    with_choices = [e for e in events if e["choices"]]
    assert all(e["usage"] is not None for e in events)
    counts = [e["usage"]["completion_tokens"] for e in with_choices]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 12
    prompt_tokens = {e["usage"]["prompt_tokens"] for e in events}
    assert len(prompt_tokens) == 1
    assert not events[-1]["choices"] and events[-1]["usage"]["completion_tokens"] == 12
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
               for e in events)
    # As vLLM: without include_usage, continuous_usage_stats adds nothing.
    quiet = stream_events(server, path, {**body, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in e for e in quiet)
    no_leak(server)


def test_chat_template_kwargs_reach_the_template(checkpoints):
    """vLLM's chat_template_kwargs: extra template variables (Qwen3's enable_thinking, say)."""
    ckpt = checkpoints["qwen2"]
    llm = LLM(ckpt.path, device="cpu", record_trace=False)
    llm.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                                   "{% if enable_thinking is defined and not enable_thinking %}<quiet>{% endif %}"
                                   "<assistant>")
    name = str(ckpt.path)
    messages = [{"role": "user", "content": "Hi"}]
    with ServerThread(llm) as server:
        def prompt_of(**extra):
            tokens = post(server, "/tokenize", {"model": name, "messages": messages, **extra})["tokens"]
            return post(server, "/detokenize", {"model": name, "tokens": tokens})["prompt"]

        assert prompt_of() == "<user>Hi<assistant>"
        assert prompt_of(chat_template_kwargs={"enable_thinking": False}) == "<user>Hi<quiet><assistant>"
        usage = [post(server, "/v1/chat/completions", {"model": name, "messages": messages, "max_tokens": 2,
                                                       **extra})["usage"]["prompt_tokens"]
                 for extra in ({}, {"chat_template_kwargs": {"enable_thinking": False}})]
        assert usage[1] > usage[0]
        bad = httpx.post(server.url + "/v1/chat/completions", json={
            "model": name, "messages": messages, "chat_template_kwargs": {"tokenize": True}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
        no_leak(server)
