"""Chapter 06's measurements: what quantization does to quality (perplexity, receipts that add
up), and what quantization-aware training wins back.

Contract: every function takes a model name (shipped name or folder) and sizes, builds real
`LLM`s with the quantization under test, and returns plain rows (dicts) a notebook prints or
plots.  Nothing here changes the package's behaviour.

    perplexity      exp(mean cross-entropy of the next token) on held-out noodle-shop text
                    (documents drawn with seed 1, as the training script held them out)
    receipt score   share of greedy receipts (prompt: a receipt's header and first item) whose every line
                    has the menu's price and q x unit = amount, whose "Items:" counts the
                    dishes and whose "Total:" is the sum (chapter 00's audit): a task the
                    model does right or wrong, unlike an average loss
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minilm_engine.course.noodle_corpus import generate_documents, make_receipt
from minilm_engine.course.experiments.cost import audit_receipt
from minilm_engine.course.baselines.contiguous_cache import NoKVCache, forward_rows
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.model.quantization import QuantizationConfig, quantize_model
from minilm_engine.course.experiments.qat import fake_quantized
from minilm_engine.core.sampling_params import SamplingParams

HELDOUT_SEED = 1  # the training script's held-out documents
TRAIN_SEED = 0
RECEIPT_SEED = 6
EVAL_WINDOW = 256
KV_CACHE_MEMORY = 32 << 20  # plenty for a few dozen receipts of a small model


@dataclass(frozen=True)
class Setting:
    """One row of the comparison: a label and the LLM arguments that produce it."""

    label: str
    quantization: str | None = None
    options: dict = field(default_factory=dict)
    dtype: str = "auto"  # the model dtype (activations, scales, unquantized weights)
    # LLM's model_backend: None is the default (the fused CPU path where it runs, quantized
    # models included), "reference" the readable decoder for this row too.
    model_backend: str | None = None


def default_settings(group_sizes=(32, 64, 128)) -> list[Setting]:
    rows = [Setting("fp32"), Setting("int8 rtn", "int8"), Setting("int8 awq", "int8", {"method": "awq"})]
    for g in group_sizes:
        for method in ("rtn", "awq"):
            rows.append(Setting(f"int4 g{g} {method}", "int4", {"group_size": g, "method": method}))
    return rows


def token_stream(tokenizer, documents: list[str]) -> torch.Tensor:
    """Documents as one id stream, each preceded by eos (as the models were trained): (T,)."""
    ids: list[int] = []
    for doc in documents:
        ids += [tokenizer.eos_token_id] + tokenizer.encode(doc, add_special_tokens=False)
    return torch.tensor(ids + [tokenizer.eos_token_id])


def windows_of(stream: torch.Tensor, length: int = EVAL_WINDOW) -> torch.Tensor:
    """Non-overlapping windows of length + 1 tokens sharing one token at the seams: (W, L + 1)."""
    num = (len(stream) - 1) // length
    starts = torch.arange(num) * length
    return stream[starts[:, None] + torch.arange(length + 1)]


def heldout_windows(tokenizer, num_documents: int) -> torch.Tensor:
    return windows_of(token_stream(tokenizer, generate_documents(num_documents, seed=HELDOUT_SEED)))


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting batch[:, 1:] from batch[:, :-1]; batch: (b, L + 1)."""
    batch = batch.to(model.device)
    inputs = batch[:, :-1]
    positions = torch.arange(inputs.shape[1], device=model.device).expand_as(inputs)
    valid = torch.ones_like(inputs, dtype=torch.bool)
    hidden = forward_rows(model, inputs, positions, NoKVCache(valid))
    logits = model.compute_logits(hidden)  # (b, L, V)
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def mean_loss(model, windows: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy of `model` (a CausalLM) over windows (W, L + 1)."""
    total = 0.0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        total += next_token_loss(model, batch).item() * batch[:, 1:].numel()
    return total / windows[:, 1:].numel()


@torch.no_grad()
def perplexity(model, windows: torch.Tensor) -> float:
    return math.exp(mean_loss(model, windows))


@torch.no_grad()
def window_losses(model, windows: torch.Tensor) -> list[float]:
    """Mean next-token loss of each window (W, L + 1): the items a perplexity difference is
    bootstrapped over (the same windows for every setting, so the comparison is paired)."""
    return [next_token_loss(model, windows[i : i + 1]).item() for i in range(len(windows))]


# -- receipts --------------------------------------------------------------------------------

def receipt_adds_up(text: str) -> bool:
    """Whether a generated receipt's lines, menu prices, item count and total are consistent
    (chapter 00's audit, `experiments.cost.audit_receipt`)."""
    return audit_receipt(text).adds_up


def receipt_prompts(num_prompts: int, seed: int = RECEIPT_SEED) -> list[str]:
    """Openings of real receipts: the header and the first line item, e.g.
    "Receipt #4898\n...\nServed by Ben\n2 x Curry Laksa @ $12.50 = $25.00\n".  With only the
    first line the greedy model would write the same order every time; the first item makes
    each receipt a different sum."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        lines = make_receipt(rng).split("\n")
        prompts.append("\n".join(lines[:5]) + "\n")  # 4 header lines + the first item
    return prompts


def receipt_score(llm: LLM, prompts: list[str], max_tokens: int = 220) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop=["Paid by"])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return sum(receipt_adds_up(p + o.outputs[0].text) for p, o in zip(prompts, outputs)) / len(prompts)


# -- the comparison --------------------------------------------------------------------------

def quality_table(
    model: str = "noodle-chef",
    settings: list[Setting] | None = None,
    num_heldout_documents: int = 200,
    num_receipts: int = 32,
    progress=None,
) -> list[dict]:
    """One row per setting: perplexity, its change vs the first row, receipt score, bytes.
    `progress(row)` is called after each row (to print as they come)."""
    settings = settings or default_settings()
    rows = []
    for setting in settings:
        start = time.perf_counter()
        llm = LLM(model, quantization=setting.quantization, quantization_config=setting.options or None,
                  record_trace=False, kv_cache_memory=KV_CACHE_MEMORY, model_backend=setting.model_backend)
        seconds = time.perf_counter() - start
        windows = heldout_windows(llm.tokenizer, num_heldout_documents)
        row = {
            "setting": setting.label,
            "perplexity": perplexity(llm.model, windows),
            "window_losses": window_losses(llm.model, windows),
            "receipts_add_up": receipt_score(llm, receipt_prompts(num_receipts)),
            "num_receipts": num_receipts,
            "weight_bytes": llm.weight_bytes,
            "quantize_seconds": seconds,
            "num_heldout_tokens": windows[:, 1:].numel(),
        }
        row["perplexity_change"] = row["perplexity"] / (rows[0]["perplexity"] if rows else row["perplexity"]) - 1
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def finetune(model, tokens: torch.Tensor, config: QuantizationConfig | None, num_steps: int,
             batch_size: int, seq_len: int, learning_rate: float, seed: int = 0) -> list[float]:
    """AdamW on random windows of `tokens`; with `config`, the projections are fake-quantized
    (QAT).  Returns the training losses."""
    from contextlib import nullcontext

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    losses = []
    with torch.enable_grad(), (fake_quantized(model, config) if config else nullcontext()):
        model.train()
        for _ in range(num_steps):
            starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
            loss = next_token_loss(model, tokens[starts[:, None] + torch.arange(seq_len + 1)])
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
    return losses


def qat_vs_ptq(
    model: str = "noodle-apprentice",
    config: QuantizationConfig | None = None,
    num_steps: int = 120,
    batch_size: int = 8,
    seq_len: int = 128,
    learning_rate: float = 1e-4,
    num_heldout_documents: int = 60,
    seed: int = 0,
) -> dict:
    """Held-out perplexity of: the float model; PTQ (its weights rounded); the same short
    fine-tune without rounding, then rounded (`finetune_ptq`, the fair baseline: a fine-tune
    alone also moves perplexity); and with the rounding in the loop, then rounded (`qat`).
    Trains on training-split text on the CPU in fp32."""
    config = config or QuantizationConfig("int4", group_size=128)

    def fresh():
        # Trains and rounds the model's own nn.Linear layers: the readable model, not the fused one.
        return LLM(model, device="cpu", record_trace=False, kv_cache_memory=KV_CACHE_MEMORY,
                   model_backend="reference")

    llm = fresh()
    windows = heldout_windows(llm.tokenizer, num_heldout_documents)
    train = token_stream(llm.tokenizer, generate_documents(400, seed=TRAIN_SEED))
    result = {"config": config.describe(), "num_steps": num_steps, "float": perplexity(llm.model, windows)}
    quantize_model(llm.model, config)
    result["ptq"] = perplexity(llm.model, windows)
    start = time.perf_counter()
    for key, fake in (("finetune_ptq", None), ("qat", config)):
        student = fresh().model
        losses = finetune(student, train, fake, num_steps, batch_size, seq_len, learning_rate, seed)
        if fake is None:
            result["finetuned_float"] = perplexity(student, windows)
        quantize_model(student, config)
        result[key] = perplexity(student, windows)
        result[f"{key}_losses"] = losses
    result["train_seconds"] = time.perf_counter() - start
    return result


# -- speed -----------------------------------------------------------------------------------

def write_random_qwen3(folder, **fields) -> None:
    """A random-weight Qwen3 checkpoint (bf16, written by transformers) with the given config
    fields, plus the shipped tokenizer: a model of any shape without downloading one."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from minilm_engine.model.loader import resolve_model_path

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**fields)).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolve_model_path("noodle-chef")).save_pretrained(folder)


def decode_speed_table(model, settings: list[Setting], num_tokens: int = 16, progress=None,
                       repeats: int = 1) -> list[dict]:
    """Batch-1 decode tokens/s and weight bytes of each setting; the `speedup` column is
    relative to the first row.

    The first setting (the baseline) stays loaded while the others are loaded one at a time,
    and each run of a setting is paired with a baseline run just before it: a machine whose load
    changes between two settings then moves both sides of a ratio, not one.  With `repeats` > 1
    a row reports the median of its runs and of its pairs' ratios."""
    import gc
    import statistics

    from minilm_engine.course.experiments.launches import decode_tokens_per_s

    def speed(llm, n=num_tokens):
        return decode_tokens_per_s(llm, "Order for table 7:", n)

    def load(setting):
        llm = LLM(model, quantization=setting.quantization, quantization_config=setting.options or None,
                  dtype=setting.dtype, max_num_seqs=1, record_trace=False, kv_cache_memory=KV_CACHE_MEMORY,
                  model_backend=setting.model_backend)
        speed(llm, 2)  # warm-up
        return llm

    def row(setting, llm, speeds, ratios):
        layer = next((m for m in llm.model.modules() if hasattr(m, "kernel")), None)
        rows.append({"setting": setting.label, "kernel": layer.kernel.name if layer else "-",
                     "backend": llm.model_backend,  # "fused" only where this CPU can run it
                     "tokens_per_s": statistics.median(speeds), "weight_bytes": llm.weight_bytes,
                     "speedup": statistics.median(ratios), "runs": speeds, "ratios": ratios})
        if progress is not None:
            progress(rows[-1])

    rows = []
    base_setting, *others = settings
    base = load(base_setting)
    row(base_setting, base, [speed(base) for _ in range(repeats)], [1.0])
    for setting in others:
        llm = load(setting)
        pairs = [(speed(base), speed(llm)) for _ in range(repeats)]
        row(setting, llm, [s for _, s in pairs], [s / b for b, s in pairs])
        del llm
        gc.collect()
    del base
    gc.collect()
    return rows
