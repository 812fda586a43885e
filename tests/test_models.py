"""Tests for minilm_engine.model: our decoder against `transformers`, logit for logit.

Every checkpoint of conftest (Llama, Llama 3 rope, Mistral, Qwen2, Qwen3; MHA, GQA, MQA; tied
and untied; head_dim != hidden/heads) is loaded by `load_model` and run with no cache, then
with a contiguous cache, and compared with the `transformers` model that wrote it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilm_engine.course.baselines.contiguous_cache import (
    ContiguousKVCache, NoKVCache, forward_rows,
)
from minilm_engine.model import CausalLM, ModelConfig, load_model

from conftest import build_hf_model, hf_config

# fp32 on a CPU: the same arithmetic in a slightly different order (our GQA expands heads, we
# reshape differently); differences are ~1e-6 on logits of size ~1-10.
FP32 = dict(rtol=1e-4, atol=1e-4)


def random_ids(vocab_size: int, shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def our_logits(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Full recompute of (B, T) ids -> (B, T, V) logits, no cache, no padding."""
    B, T = ids.shape
    positions = torch.arange(T)[None].expand(B, T)
    hidden = forward_rows(model, ids, positions, NoKVCache(torch.ones(B, T, dtype=torch.bool)))
    return model.compute_logits(hidden)


@torch.inference_mode()
def hf_logits(hf_model, ids: torch.Tensor) -> torch.Tensor:
    return hf_model(input_ids=ids).logits.float()


# ---------------------------------------------------------------------- logits vs transformers
def test_logits_match_transformers(checkpoint):
    model = load_model(checkpoint.path)
    ids = random_ids(model.config.vocab_size, (2, 23))
    ours, theirs = our_logits(model, ids), hf_logits(checkpoint.hf_model, ids)
    assert ours.shape == (2, 23, model.config.vocab_size)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, **FP32)
    # Peaked logits: the gap between the two best tokens dwarfs the float noise, so greedy
    # decoding picks the same token as `transformers` (what test_generate relies on).
    top2 = theirs.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 10 * (ours - theirs).abs().max()


def test_long_positions_match_transformers(checkpoints):
    # Positions far past llama3's original context (128) exercise every scaled frequency band.
    ckpt = checkpoints["llama3_rope"]
    model = load_model(ckpt.path)
    ids = random_ids(model.config.vocab_size, (1, 200), seed=1)
    torch.testing.assert_close(our_logits(model, ids), hf_logits(ckpt.hf_model, ids), **FP32)


def test_loaded_config_describes_the_checkpoint(checkpoints):
    assert load_model(checkpoints["qwen2"].path).config.qkv_bias
    assert load_model(checkpoints["qwen3"].path).config.qk_norm
    llama3 = load_model(checkpoints["llama3_rope"].path).config
    assert llama3.rope.rope_type == "llama3" and llama3.tie_word_embeddings
    mistral = load_model(checkpoints["mistral"].path).config
    assert (mistral.head_dim, mistral.num_queries_per_kv) == (16, 4)


def test_tied_embeddings_share_one_tensor(checkpoints):
    tied = load_model(checkpoints["qwen2"].path)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    untied = load_model(checkpoints["llama"].path)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert not torch.equal(untied.lm_head.weight, untied.model.embed_tokens.weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_smoke(checkpoints, dtype):
    ckpt = checkpoints["qwen3"]
    model = load_model(ckpt.path, dtype=dtype)
    assert model.dtype == dtype
    ids = random_ids(model.config.vocab_size, (1, 16), seed=2)
    ours = our_logits(model, ids)
    theirs = hf_logits(ckpt.hf_model, ids)
    assert ours.dtype == torch.float32 and torch.isfinite(ours).all()
    # Half precision keeps ~3 significant digits: the logits (size ~5) agree to a few tenths,
    # and the peaked distribution keeps its top token nearly everywhere.
    scale = theirs.abs().max()
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=0.1 * scale)
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean()
    assert agree >= 0.9


# ---------------------------------------------------------------------- caches
@torch.inference_mode()
def test_prefill_then_decode_equals_full_recompute(checkpoint):
    model = load_model(checkpoint.path)
    T, prefill_len = 20, 7
    ids = random_ids(model.config.vocab_size, (2, T), seed=3)
    full = our_logits(model, ids)  # (2, T, V)
    cache = ContiguousKVCache(
        model.config, batch_size=2, max_len=T, dtype=model.dtype, device="cpu"
    )
    # Prefill 7 tokens, then a chunk of 3, then one token at a time.
    chunks = [(0, prefill_len), (prefill_len, prefill_len + 3)] + [
        (t, t + 1) for t in range(prefill_len + 3, T)
    ]
    for start, end in chunks:
        cache.begin_step(torch.ones(2, end - start, dtype=torch.bool))
        positions = torch.arange(start, end)[None].expand(2, -1)
        hidden = forward_rows(model, ids[:, start:end], positions, cache)
        torch.testing.assert_close(model.compute_logits(hidden), full[:, start:end], **FP32)
    assert cache.num_used_slots == T
    with pytest.raises(ValueError, match="KV cache full"):
        cache.begin_step(torch.ones(2, 1, dtype=torch.bool))


@torch.inference_mode()
def test_left_padding_is_invisible(checkpoints):
    # Static batching left-pads short prompts: a padded row must give its unpadded logits.
    ckpt = checkpoints["qwen2"]  # biases make "a padding row that attends nowhere" matter
    model = load_model(ckpt.path)
    long_ids = random_ids(model.config.vocab_size, (1, 12), seed=4)
    short_ids = random_ids(model.config.vocab_size, (1, 5), seed=5)
    pad = 7
    ids = torch.cat([long_ids, torch.cat([torch.full((1, 7), pad), short_ids], dim=1)])
    valid = ids.new_ones(ids.shape, dtype=torch.bool)
    valid[1, :7] = False
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    hidden = forward_rows(model, ids, positions, NoKVCache(valid))
    logits = model.compute_logits(hidden)
    torch.testing.assert_close(logits[0], our_logits(model, long_ids)[0], **FP32)
    torch.testing.assert_close(logits[1, 7:], our_logits(model, short_ids)[0], **FP32)
    torch.testing.assert_close(logits[1, 7:], hf_logits(ckpt.hf_model, short_ids)[0], **FP32)
    # ... and through the contiguous cache, with decode steps after the padded prefill.
    cache = ContiguousKVCache(
        model.config, batch_size=2, max_len=14, dtype=torch.float32, device="cpu"
    )
    cache.begin_step(valid)
    forward_rows(model, ids, positions, cache)
    next_ids = torch.tensor([[3], [4]])
    cache.begin_step(torch.ones(2, 1, dtype=torch.bool))
    step = model.compute_logits(forward_rows(model, next_ids, torch.tensor([[12], [5]]), cache))
    torch.testing.assert_close(
        step[0, 0], our_logits(model, torch.cat([long_ids, next_ids[:1]], 1))[0, -1], **FP32
    )
    torch.testing.assert_close(
        step[1, 0], our_logits(model, torch.cat([short_ids, next_ids[1:]], 1))[0, -1], **FP32
    )


# ---------------------------------------------------------------------- parameter count
def test_num_parameters_counts_real_parameters(checkpoint):
    model = load_model(checkpoint.path)
    real = sum(p.numel() for p in model.parameters())  # shared tensors counted once
    hf_real = sum(p.numel() for p in checkpoint.hf_model.parameters())
    assert model.config.num_parameters() == real == hf_real


def test_kv_bytes_per_token():
    config = ModelConfig(
        model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=64,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64,
    )  # fmt: skip
    assert config.kv_bytes_per_token() == 2 * 3 * 2 * 8 * 2
    cache = ContiguousKVCache(config, batch_size=1, max_len=5, dtype=torch.float16, device="cpu")
    assert cache.num_bytes == 5 * config.kv_bytes_per_token()


# ---------------------------------------------------------------------- any config
@st.composite
def random_configs(draw):
    family = draw(st.sampled_from(["llama", "mistral", "qwen2", "qwen3"]))
    num_kv_heads = draw(st.sampled_from([1, 2, 3]))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([4, 8, 12, 16]))
    hidden_size = draw(st.sampled_from([16, 24, 32, 48]))
    overrides = dict(
        hidden_size=hidden_size,
        intermediate_size=draw(st.sampled_from([16, 40, 64])),
        num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=draw(st.booleans()),
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
    )
    rope = {"rope_type": "default", "rope_theta": draw(st.sampled_from([10000.0, 500000.0]))}
    if family == "llama" and draw(st.booleans()):
        rope = {
            "rope_type": "llama3",
            "rope_theta": rope["rope_theta"],
            "factor": draw(st.sampled_from([2.0, 8.0])),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": draw(st.sampled_from([16, 64])),
        }
    if family in ("mistral",):
        overrides["sliding_window"] = None
    overrides["rope_scaling"] = rope
    return family, overrides, draw(st.integers(0, 2**16))


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=random_configs())
def test_random_configs_match_transformers(spec):
    family, overrides, seed = spec
    config = hf_config(family, vocab_size=64, eos_token_id=0, **overrides)
    hf_model = build_hf_model(family, config, seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        hf_model.save_pretrained(folder)
        model = load_model(Path(folder))
    real = sum(p.numel() for p in model.parameters())
    assert model.config.num_parameters() == real == sum(p.numel() for p in hf_model.parameters())
    ids = random_ids(64, (2, 40), seed=seed)
    torch.testing.assert_close(our_logits(model, ids), hf_logits(hf_model, ids), **FP32)
