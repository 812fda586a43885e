"""What the benchmark scripts share: the CPU thread setting, and the transformers baseline."""

from __future__ import annotations

import argparse
import time

import torch

# The real shape the CPU benchmarks measure (random weights), and the tiny variant of --quick.
QWEN3_0_6B = "Qwen/Qwen3-0.6B"
QUICK_OVERRIDES = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                       bos_token_id=1, eos_token_id=2)


def add_threads_option(parser: argparse.ArgumentParser, default: int = 1, why: str | None = None) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=default,
        help=f"torch CPU threads (default {default}: "
        + (why or "small models gain nothing from more, and a busy machine makes extra threads very slow")
        + ")",
    )


def apply_threads_option(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)


def sync(device: torch.device) -> None:
    """Wait for the GPU, so that a timer read after this sees the work done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate_static(
    model, prompts: list[list[int]], output_lens: list[int], batch_size: int, pad_id: int = 0
) -> tuple[int, float]:
    """`transformers` `model.generate` on left-padded batches in request order, each batch
    running to its longest output (EOS ignored): static batching as most scripts do it.
    Returns (output tokens produced, seconds)."""
    from transformers import GenerationConfig

    device = model.device
    num_tokens = 0
    sync(device)
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        n = max(output_lens[i : i + batch_size])
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  pad_token_id=pad_id, eos_token_id=model.config.eos_token_id)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        num_tokens += (out.shape[1] - width) * len(batch)
    sync(device)
    return num_tokens, time.perf_counter() - start
