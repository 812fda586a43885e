"""Tests for minilm_engine.entrypoints.llm and the serving strategies: greedy output equals `transformers`.

Greedy decoding has one right answer, so every strategy must reproduce, token for token, what
`transformers.generate(do_sample=False)` produces from the same checkpoint.  The rest checks
the API around it: output order, finish reasons, stop rules, limits, errors and streaming.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.baselines import STRATEGIES

STRATEGY_NAMES = sorted(STRATEGIES)
NUM_NEW_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS)


@pytest.fixture(scope="session")
def hf_greedy(checkpoints):
    """hf_greedy(checkpoint_name, prompt_ids, n) -> the new token ids `transformers` generates."""

    @lru_cache(maxsize=None)
    def run(name: str, prompt_ids: tuple[int, ...], n: int) -> list[int]:
        ckpt = checkpoints[name]
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            out = ckpt.hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=ckpt.eos_token_id,
            )
        return out[0, len(prompt_ids) :].tolist()

    return run


def make_llm(path, strategy: str = "kv_cache", **kwargs) -> LLM:
    return BaselineLLM(path, strategy=strategy, **kwargs)


def generate(llm: LLM, prompts, params=GREEDY):
    return llm.generate(prompts, params, use_tqdm=False)


def encode(tokenizer, prompt: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(prompt, add_special_tokens=True))


# ---------------------------------------------------------------------- greedy == transformers
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_greedy_matches_transformers(checkpoint, strategy, prompts, hf_greedy):
    llm = make_llm(checkpoint.path, strategy)
    outputs = generate(llm, prompts)
    for prompt, output in zip(prompts, outputs):
        ids = encode(checkpoint.tokenizer, prompt)
        expected = hf_greedy(checkpoint.name, ids, NUM_NEW_TOKENS)
        assert output.prompt == prompt
        assert output.prompt_token_ids == list(ids)
        assert output.outputs[0].token_ids == expected, (checkpoint.name, strategy, prompt)
        assert output.finished


@pytest.mark.parametrize("strategy", ["static_batch", "continuous"])
def test_batched_equals_one_at_a_time(checkpoint, prompts, strategy):
    # 5 prompts of different lengths, at most 3 at a time: static batching runs batches of 3
    # and 2 (left padding must not leak); continuous batching admits the last two as slots free.
    assert strategy in STRATEGIES, f"no {strategy!r} strategy: this test must not pass by skipping"
    batched = generate(make_llm(checkpoint.path, strategy, max_num_seqs=3), prompts)
    single = make_llm(checkpoint.path, "kv_cache")
    for prompt, output in zip(prompts, batched):
        (alone,) = generate(single, [prompt])
        assert output.outputs[0].token_ids == alone.outputs[0].token_ids
        assert output.outputs[0].text == alone.outputs[0].text


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_outputs_come_back_in_prompt_order(checkpoints, strategy, prompts):
    llm = make_llm(checkpoints["qwen3"].path, strategy, max_num_seqs=2)
    # Different max_tokens, so requests finish in an order unlike the prompts'.
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (9, 2, 5, 1, 7)]
    outputs = generate(llm, prompts, params)
    assert [o.prompt for o in outputs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outputs] == [9, 2, 5, 1, 7]
    request_ids = [int(o.request_id) for o in outputs]
    assert request_ids == sorted(request_ids) and len(set(request_ids)) == 5


def test_one_sampling_params_per_prompt(checkpoints, prompts, hf_greedy):
    ckpt = checkpoints["llama3_rope"]
    llm = make_llm(ckpt.path, "static_batch")
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (3, 8, 1, 12, 5)]
    outputs = generate(llm, prompts, params)
    for prompt, p, output in zip(prompts, params, outputs):
        full = hf_greedy(ckpt.name, encode(ckpt.tokenizer, prompt), NUM_NEW_TOKENS)
        assert output.outputs[0].token_ids == full[: p.max_tokens]
    with pytest.raises(ValueError, match="got 2 SamplingParams for 5 prompts"):
        generate(llm, prompts, params[:2])


def test_prompt_token_ids_input(checkpoints, prompts):
    ckpt = checkpoints["mistral"]
    llm = make_llm(ckpt.path)
    ids = [list(encode(ckpt.tokenizer, p)) for p in prompts[:3]]
    from_ids = generate(llm, [{"prompt_token_ids": i} for i in ids])
    from_text = generate(llm, prompts[:3])
    for a, b, i in zip(from_ids, from_text, ids):
        assert a.prompt is None and a.prompt_token_ids == i
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
    # A single prompt (not in a list) is accepted too.
    (single,) = generate(llm, {"prompt_token_ids": ids[0]})
    assert single.outputs[0].token_ids == from_ids[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="prompt_token_ids must be ints"):
        generate(llm, {"prompt_token_ids": [1, 10_000]})
    with pytest.raises(ValueError, match="empty"):
        generate(llm, {"prompt_token_ids": []})


# ---------------------------------------------------------------------- finishing
@pytest.fixture
def reference(checkpoints, hf_greedy, prompts):
    """(checkpoint, prompt, its 20 greedy tokens), chosen with no EOS among them."""
    ckpt = checkpoints["qwen2"]
    prompt = prompts[2]
    tokens = hf_greedy(ckpt.name, encode(ckpt.tokenizer, prompt), NUM_NEW_TOKENS)
    assert ckpt.eos_token_id not in tokens
    return ckpt, prompt, tokens


def test_finish_reason_length(reference):
    ckpt, prompt, tokens = reference
    (out,) = generate(make_llm(ckpt.path), prompt, SamplingParams(temperature=0, max_tokens=6))
    assert out.outputs[0].token_ids == tokens[:6]
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].stop_reason is None


def with_extra_eos(folder: Path, tmp_path: Path, eos_id: int) -> Path:
    """A copy of the checkpoint whose generation_config.json adds `eos_id` as an EOS token."""
    copy = Path(shutil.copytree(folder, tmp_path / "ckpt"))
    gen_file = copy / "generation_config.json"
    gen = json.loads(gen_file.read_text())
    gen["eos_token_id"] = [gen["eos_token_id"], eos_id]
    gen_file.write_text(json.dumps(gen))
    return copy


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_eos_stops_and_ignore_eos_continues(reference, tmp_path, strategy):
    ckpt, prompt, tokens = reference
    eos = tokens[5]  # pretend the sixth greedy token is an end-of-sequence token
    first = tokens.index(eos)
    llm = make_llm(with_extra_eos(ckpt.path, tmp_path, eos), strategy)
    (out,) = generate(llm, prompt)
    assert out.outputs[0].token_ids == tokens[: first + 1]  # the EOS is kept in the ids
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason is None  # vLLM: EOS ends it with no stop_reason
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    (out,) = generate(llm, prompt, params)
    assert out.outputs[0].token_ids == tokens
    assert out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_stop_token_ids(reference, strategy):
    ckpt, prompt, tokens = reference
    stop = tokens[7]
    first = tokens.index(stop)
    llm = make_llm(ckpt.path, strategy)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, stop_token_ids=[stop, 9999])
    (out,) = generate(llm, prompt, params)
    assert out.outputs[0].token_ids == tokens[: first + 1]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop
    # ignore_eos is about EOS only: stop tokens still stop.
    params = SamplingParams(
        temperature=0, max_tokens=NUM_NEW_TOKENS, stop_token_ids=[stop], ignore_eos=True
    )
    (out,) = generate(llm, prompt, params)
    assert out.outputs[0].token_ids == tokens[: first + 1]


def pick_stop_string(text: str, start: int = 4) -> str:
    """A two-character piece of `text` after `start` made of ordinary printable characters."""
    for i in range(start, len(text) - 1):
        piece = text[i : i + 2]
        if piece.isprintable() and "\ufffd" not in piece:
            return piece
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_stop_strings_truncate_text(reference, strategy):
    ckpt, prompt, tokens = reference
    tok = ckpt.tokenizer
    full_text = tok.decode(tokens, skip_special_tokens=True)
    stop = pick_stop_string(full_text)
    # Independently: the first k tokens whose text contains the stop string.
    k = next(k for k in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:k]))
    text_k = tok.decode(tokens[:k])
    llm = make_llm(ckpt.path, strategy)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, stop=["never seen", stop])
    (out,) = generate(llm, prompt, params)
    assert out.outputs[0].token_ids == tokens[:k]
    assert out.outputs[0].text == text_k[: text_k.index(stop)]
    assert stop not in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop


def test_stop_string_that_never_appears(reference):
    ckpt, prompt, tokens = reference
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, stop="\x00never\x00")
    (out,) = generate(make_llm(ckpt.path), prompt, params)
    assert out.outputs[0].token_ids == tokens
    assert out.outputs[0].text == ckpt.tokenizer.decode(tokens, skip_special_tokens=True)
    assert out.outputs[0].finish_reason == "length"


# ---------------------------------------------------------------------- context limits
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("max_tokens", [None, 50])
def test_max_model_len_gives_length(reference, strategy, max_tokens):
    ckpt, prompt, tokens = reference
    num_prompt = len(encode(ckpt.tokenizer, prompt))
    llm = make_llm(ckpt.path, strategy, max_model_len=num_prompt + 4)
    (out,) = generate(llm, prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
    assert out.outputs[0].token_ids == tokens[:4]  # prompt + output fill the context exactly
    assert out.outputs[0].finish_reason == "length"


def test_max_tokens_none_runs_to_the_context(checkpoints, hf_greedy):
    # The model's own limit (max_position_embeddings) when max_model_len is not given.
    ckpt = checkpoints["qwen3"]
    llm = make_llm(ckpt.path, "kv_cache")
    assert llm.max_model_len == ckpt.hf_model.config.max_position_embeddings
    prompt_ids = list(range(1, 251))
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    (out,) = generate(llm, {"prompt_token_ids": prompt_ids}, params)
    assert len(out.outputs[0].token_ids) == llm.max_model_len - len(prompt_ids)
    assert out.outputs[0].finish_reason == "length"


def test_prompt_too_long(checkpoints):
    llm = make_llm(checkpoints["llama"].path, max_model_len=10)
    with pytest.raises(ValueError, match=r"has 10 tokens.*holds 10"):
        generate(llm, {"prompt_token_ids": list(range(1, 11))})
    with pytest.raises(ValueError, match=r"has 12 tokens.*holds 10"):
        generate(llm, {"prompt_token_ids": list(range(1, 13))})
    (out,) = generate(llm, {"prompt_token_ids": list(range(1, 10))})  # 9 + 1 fits
    assert len(out.outputs[0].token_ids) == 1


def test_a_refused_prompt_does_not_shift_later_request_ids(checkpoints):
    llm = make_llm(checkpoints["llama"].path, max_model_len=10)
    with pytest.raises(ValueError):
        generate(llm, {"prompt_token_ids": list(range(1, 20))})
    (out,) = generate(llm, {"prompt_token_ids": [1, 2, 3]})
    assert out.request_id == "0"  # the refused prompt took no id (ids seed the sampling)


def test_repr_names_the_model_as_the_caller_did():
    # a shipped model by its name, not the folder it resolves to on this machine (notebook
    # outputs are committed and read on other machines)
    llm = LLM("noodle-apprentice", record_trace=False)
    assert repr(llm).startswith("LLM(model='noodle-apprentice', device=cpu")
    assert llm.model_path.is_dir() and llm.model_path.name == "noodle-apprentice"


def test_bad_llm_arguments(checkpoints):
    path = checkpoints["llama"].path
    with pytest.raises(ValueError, match=r"strategy must be one of .*'kv_cache'.*got 'paged'"):
        BaselineLLM(path, strategy="paged")
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(path, max_model_len=10_000)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(path, max_num_seqs=0)
    with pytest.raises(TypeError, match="seed"):
        LLM(path, seed=True)


def test_bad_prompts(checkpoints):
    llm = make_llm(checkpoints["llama"].path)
    with pytest.raises(TypeError, match="prompt"):
        generate(llm, [42])
    with pytest.raises(TypeError, match="prompts must be"):
        generate(llm, 42)
    with pytest.raises(TypeError, match="SamplingParams"):
        generate(llm, ["a", "b"], [GREEDY, {"temperature": 0}])


# ---------------------------------------------------------------------- streaming
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_stream_joins_to_generate_text(checkpoint, strategy, prompts):
    llm = make_llm(checkpoint.path, strategy)
    for prompt in prompts[:3]:
        (out,) = generate(llm, prompt)
        pieces = list(llm.stream(prompt, GREEDY))
        assert "".join(pieces) == out.outputs[0].text
        assert all(pieces)  # no empty pieces


def test_stream_with_stop_string(reference):
    ckpt, prompt, tokens = reference
    stop = pick_stop_string(ckpt.tokenizer.decode(tokens, skip_special_tokens=True))
    llm = make_llm(ckpt.path)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, stop=stop)
    (out,) = generate(llm, prompt, params)
    streamed = "".join(llm.stream(prompt, params))
    assert streamed == out.outputs[0].text
    assert stop not in streamed
