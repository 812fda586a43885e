"""The OpenAI-compatible server against the official `openai` client, real uvicorn on a loopback port.

Greedy answers must equal `LLM.generate` token for token (the server adds nothing of its own);
streamed text must join to the same answer; chat uses the shipped model's dialogue template, or
the checkpoint's own template when it has one; /v1/models, /health, /metrics, the API key, and
the curl and Python examples of docs/SERVING.md work as written.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.entrypoints.chat_template import NOODLE_CHAT_TEMPLATE, chat_format_for, render_chat
from minilm_engine.course.experiments.server_thread import ServerThread

PROMPTS = ["Order for table 7:\n", "Receipt #7061\n", "Shop diary, 12 March\n"]
SERVING_DOC = Path(__file__).resolve().parent.parent / "docs" / "SERVING.md"


@pytest.fixture(scope="module")
def llm():
    """The reference: each prompt alone (the server's own engine belongs to its thread)."""
    return BaselineLLM("noodle-chef", device="cpu", strategy="kv_cache")


@pytest.fixture(scope="module")
def server_llm():
    return LLM("noodle-chef", device="cpu", record_trace=False)


@pytest.fixture(scope="module")
def server(server_llm):
    with ServerThread(server_llm) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def expected_text(llm, prompt, max_tokens, **kw):
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **kw), use_tqdm=False)
    return out.outputs[0]


def test_completion_equals_llm_generate(client, llm):
    for prompt in PROMPTS:
        answer = client.completions.create(model="noodle-chef", prompt=prompt, max_tokens=20, temperature=0)
        want = expected_text(llm, prompt, 20)
        assert answer.choices[0].text == want.text
        assert answer.choices[0].finish_reason == want.finish_reason
        assert answer.usage.completion_tokens == len(want.token_ids)
        assert answer.usage.prompt_tokens == len(llm.tokenizer.encode(prompt))
        assert answer.model == "noodle-chef" and answer.object == "text_completion"


def test_streamed_completion_joins_to_the_same_text(client, llm):
    chunks = list(client.completions.create(model="noodle-chef", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    want = expected_text(llm, PROMPTS[0], 20)
    assert len(text_chunks) > 5  # really streamed, not one piece
    assert "".join(c.choices[0].text for c in text_chunks) == want.text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


def test_stop_strings_are_cut_and_never_streamed(client, llm):
    prompt = "Receipt #7061\n"
    want = expected_text(llm, prompt, 40, stop=["\n"])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="noodle-chef", prompt=prompt, max_tokens=40, temperature=0, stop=["\n"], stream=True))
    assert streamed == want.text and "\n" not in streamed


def test_seeded_sampling_is_reproducible(client):
    def ask():
        return client.completions.create(model="noodle-chef", prompt=PROMPTS[1], max_tokens=16,
                                         temperature=1.0, top_p=0.9, seed=1234).choices[0].text
    assert ask() == ask()


def test_chat_uses_the_dialogue_template(client, llm):
    messages = [{"role": "system", "content": "Be short."},
                {"role": "user", "content": "Good evening! Two, please."}]
    answer = client.chat.completions.create(model="noodle-chef", messages=messages, max_tokens=40, temperature=0)
    prompt = render_chat(llm.tokenizer, chat_format_for(llm.tokenizer, llm.model_path), messages)
    assert prompt == "Be short.\nAna: Good evening! Two, please.\nSam:"
    want = expected_text(llm, prompt, 40, stop=["\n"])
    assert answer.choices[0].message.content == want.text
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == want.finish_reason
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

    stream = client.chat.completions.create(model="noodle-chef", messages=messages, max_tokens=40,
                                            temperature=0, stream=True)
    deltas = [c.choices[0] for c in stream]
    assert deltas[0].delta.role == "assistant"
    assert "".join(d.delta.content or "" for d in deltas) == want.text
    assert deltas[-1].finish_reason == want.finish_reason


def test_chat_ignore_eos_ignores_the_templates_end_of_turn_too(client, llm):
    """The dialogue template's "\\n" ends the waiter's turn like an end-of-turn token; with
    ignore_eos (vLLM: generation_config's eos ids are then no stops) the answer runs to
    max_tokens, as load generators (guidellm, bench serve) ask."""
    messages = [{"role": "user", "content": "How much is the Miso Ramen?"}]
    prompt = render_chat(llm.tokenizer, chat_format_for(llm.tokenizer, llm.model_path), messages)
    short = client.chat.completions.create(model="noodle-chef", messages=messages, max_tokens=40, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 40
    full = client.chat.completions.create(model="noodle-chef", messages=messages, max_tokens=40, temperature=0,
                                          extra_body={"ignore_eos": True})
    want = expected_text(llm, prompt, 40, ignore_eos=True)
    assert full.usage.completion_tokens == 40 and full.choices[0].finish_reason == "length"
    assert full.choices[0].message.content == want.text and "\n" in want.text
    (offline,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    assert offline.outputs[0].text == want.text  # LLM.chat: the same template, the same rule
    # A stop the client asks for still applies.
    asked = client.chat.completions.create(model="noodle-chef", messages=messages, max_tokens=40, temperature=0,
                                           stop=["\n"], extra_body={"ignore_eos": True})
    assert asked.choices[0].message.content == short.choices[0].message.content


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["noodle-chef"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    client.completions.create(model="noodle-chef", prompt=PROMPTS[0], max_tokens=4, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hits_total",
                 "prefix_cache_queries_total", "num_preemptions_total", "prompt_tokens_total",
                 "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_count"):
        assert f"minilm:{name}" in text, name
    generated = float(re.search(r'minilm:generation_tokens_total\{model_name="noodle-chef"\} (\S+)', text).group(1))
    assert generated >= 4


def test_prefix_cache_hits_are_counted(client, server):
    before = server.engine.stats.num_prefix_cache_hits
    prompt = "The Golden Bowl " * 12  # 48 tokens: whole blocks the second request can reuse
    for _ in range(2):
        client.completions.create(model="noodle-chef", prompt=prompt, max_tokens=2, temperature=0)
    assert server.engine.stats.num_prefix_cache_hits - before >= 16


def test_one_engine_cannot_be_served_twice(server_llm, server):
    with pytest.raises(RuntimeError, match="did not start"):
        ServerThread(server_llm).start(timeout=10)  # its lifespan refuses: two threads, one engine


def test_api_key_is_checked_on_every_route_but_health():
    with ServerThread(LLM("noodle-apprentice", device="cpu", record_trace=False), api_key="s3cret") as server:
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        assert good.completions.create(model="noodle-apprentice", prompt="Hi", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model="noodle-apprentice", prompt="Hi", max_tokens=2)
        assert e.value.body["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200


def test_a_checkpoints_own_chat_template_wins(checkpoints):
    ckpt = checkpoints["qwen2"]
    llm = LLM(ckpt.path, device="cpu", record_trace=False)
    reference = BaselineLLM(ckpt.path, device="cpu", strategy="kv_cache")
    assert chat_format_for(llm.tokenizer, llm.model_path) is None  # a tiny test model has none
    with ServerThread(llm) as server:
        reply = httpx.post(server.url + "/v1/chat/completions",
                           json={"model": str(ckpt.path), "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "no_chat_template"
    llm.tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    fmt = chat_format_for(llm.tokenizer, llm.model_path)
    assert fmt.template != NOODLE_CHAT_TEMPLATE and fmt.default_stop == ()
    assert render_chat(llm.tokenizer, fmt, [{"role": "user", "content": "Hi"}]) == "<user>Hi<assistant>"
    with ServerThread(llm) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(model=str(ckpt.path), messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, temperature=0)
        want = expected_text(reference, "<user>Hi<assistant>", 5)
        assert answer.choices[0].message.content == want.text


def _serving_doc() -> str:
    """docs/SERVING.md, the serving manual: every curl and Python example in it is run."""
    return SERVING_DOC.read_text()


def test_serving_doc_curl_examples_work(server):
    section = _serving_doc()
    commands = re.findall(r"^(curl .*?)(?<!\\)$", section.replace("\\\n", " "), flags=re.M)
    assert len(commands) >= 3
    for command in commands:
        command = command.replace("http://127.0.0.1:8000", server.url)
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)
        assert '"error"' not in done.stdout and done.stdout.strip(), (command, done.stdout)


def test_serving_doc_python_example_works(server, capsys):
    section = _serving_doc()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", section, flags=re.S) if "openai" in block]
    exec(compile(code.replace("http://127.0.0.1:8000", server.url), "docs/SERVING.md", "exec"), {})
    assert capsys.readouterr().out.strip()


def test_served_model_names_are_what_clients_use():
    llm = LLM("noodle-apprentice", device="cpu", record_trace=False)
    with ServerThread(llm, served_model_names=["waiter", "noodle-apprentice"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["waiter", "noodle-apprentice"]
        for name in ("waiter", "noodle-apprentice"):
            assert client.completions.create(model=name, prompt="Hi", max_tokens=2).model == name
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="noodle-chef", prompt="Hi", max_tokens=2)
