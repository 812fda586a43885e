"""Train the two models minilm-engine ships: the chef (target) and its apprentice (draft).

Both are ordinary `transformers` Llama models trained from scratch on the synthetic noodle-shop
corpus of `minilm_engine.course.noodle_corpus`, and they share one byte-level BPE tokenizer, so the
apprentice can draft tokens that the chef verifies (speculative decoding). Everything is seeded:
the same command gives the same corpus, tokenizer, initial weights and batches (GPU kernels may
still differ in the last bits from run to run).

    1. generate the corpus: a train split and a held-out split from different seeds
    2. train the tokenizer on the train split (`<|endoftext|>` is bos, eos and pad)
    3. train each model on random 512-token windows of the packed train split
    4. measure held-out loss / perplexity (on the float16-rounded weights that get shipped)
       and how often the apprentice's greedy guess equals the chef's
    5. save each model in float16 with the tokenizer, a generation config and a model card

Reproduce the shipped checkpoints on one GPU (about 3 minutes on an H200):

    python scripts/train_shipped_models.py --device cuda

Quick smoke run on a CPU (seconds, useless models, never into the shipped folder):

    python scripts/train_shipped_models.py --device cpu --target-steps 20 --draft-steps 20 \
        --batch-size 4 --out-dir /tmp/noodle-smoke
"""

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout, no install needed
from minilm_engine.course.noodle_corpus import generate_documents  # noqa: E402

EOS = "<|endoftext|>"
TRAIN_SEED, HELDOUT_SEED = 0, 1  # corpus seeds: the held-out text is never seen in training
TOKENS_PER_DOCUMENT = 120  # measured average, used to size the corpus to the number of steps


@dataclass(frozen=True)
class ModelSpec:
    """Shape and learning rate of one shipped model (Hugging Face `LlamaConfig` names)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    learning_rate: float


CHEF = ModelSpec("noodle-chef", hidden_size=320, num_hidden_layers=6, num_attention_heads=5,
                 num_key_value_heads=1, intermediate_size=896, learning_rate=2e-3)
APPRENTICE = ModelSpec("noodle-apprentice", hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=384,
                       learning_rate=3e-3)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--steps", type=int, default=None,
                        help="shortcut: the same number of steps for both models")
    parser.add_argument("--target-steps", type=int, default=3000, help="steps for noodle-chef")
    parser.add_argument("--draft-steps", type=int, default=3000,
                        help="steps for noodle-apprentice")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="upper bound: BPE stops earlier once every word of the corpus is "
                             "one token")
    parser.add_argument("--num-train-docs", type=int, default=None,
                        help="default: enough for one pass of the longer run, capped at 250k")
    parser.add_argument("--num-heldout-docs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1234, help="seed of weights and batches")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "minilm_engine" / "checkpoints")
    args = parser.parse_args()
    if args.steps is not None:
        args.target_steps = args.draft_steps = args.steps
    if min(args.target_steps, args.draft_steps, args.batch_size, args.seq_len) < 1:
        parser.error("--steps, --target-steps, --draft-steps, --batch-size and --seq-len "
                     "must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False; use --device cpu")
    if args.num_train_docs is None:
        num_tokens = max(args.target_steps, args.draft_steps) * args.batch_size * args.seq_len
        args.num_train_docs = min(max(num_tokens // TOKENS_PER_DOCUMENT, 2000), 250_000)
    return args


# ---------------------------------------------------------------------------------------------
# 1-2. Corpus and tokenizer.

# GPT-2's pre-tokenizer pattern with one change: `\p{N}+` (a whole number) became ` ?\p{N}`
# (one digit, with its leading space if any).
PRE_TOKENIZER_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+"
                         r"|\s+(?!\S)|\s+")


def train_tokenizer(documents: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) that splits numbers into single digits.

    Byte level: any text round-trips exactly, spaces and newlines included. Single digits: a
    price like 19.50 is the tokens 1 9 . 5 0, so adding up a receipt is digit-by-digit work
    instead of memorising one token per number.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),  # bytes -> symbols
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(documents, trainer)
    # No bos is added on encode, so decode(encode(text)) == text; clean-up would eat spaces.
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS,
                                   pad_token=EOS, clean_up_tokenization_spaces=False,
                                   model_max_length=1024)


def pack(tokenizer: PreTrainedTokenizerFast, documents: list[str],
         chunk_size: int = 10_000) -> torch.Tensor:
    """All documents as one stream of ids, each one preceded by eos: (num_tokens,) int64.

    `eos doc eos doc ... eos`: eos ends a document and doubles as the start-of-document token.
    Encoded in chunks (Rust, all cores) and turned into arrays at once: a Python list of
    millions of `Encoding`s would take gigabytes.
    """
    eos = np.array([tokenizer.eos_token_id], dtype=np.int32)
    pieces = []
    for i in range(0, len(documents), chunk_size):
        for encoding in tokenizer.backend_tokenizer.encode_batch(documents[i:i + chunk_size]):
            pieces += [eos, np.array(encoding.ids, dtype=np.int32)]
    pieces.append(eos)
    return torch.from_numpy(np.concatenate(pieces)).long()


# ---------------------------------------------------------------------------------------------
# 3. Training.

def make_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    eos_id = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )
    model = LlamaForCausalLM(config)
    model.config.use_cache = False  # training sees whole windows; nothing to cache
    return model


def learning_rate(step: int, num_steps: int, peak: float) -> float:
    """Linear warmup over 5% of the steps (at most 200), then cosine decay to peak / 10."""
    num_warmup = max(1, min(200, num_steps // 20))
    if step < num_warmup:
        return peak * (step + 1) / num_warmup
    progress = (step - num_warmup) / max(1, num_steps - num_warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def autocast(device: str):
    """bf16 autocast on a GPU (weights stay fp32); plain fp32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")


def next_token_loss(model: LlamaForCausalLM, windows: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting windows[:, 1:] from windows[:, :-1]."""
    logits = model(input_ids=windows[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


def train(model: LlamaForCausalLM, spec: ModelSpec, tokens: torch.Tensor, num_steps: int,
          args: argparse.Namespace) -> dict:
    """AdamW on random windows of `tokens` (already on the device); returns timing stats."""
    decay = [p for p in model.parameters() if p.dim() >= 2]  # no weight decay on norm gains
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.learning_rate, betas=(0.9, 0.95), fused=args.device == "cuda")
    # All window starts are drawn up front: one copy to the device instead of one per step
    # (a copy from pageable host memory would wait for the GPU every step).
    generator = torch.Generator().manual_seed(args.seed)
    all_starts = torch.randint(0, len(tokens) - args.seq_len - 1, (num_steps, args.batch_size),
                               generator=generator).to(tokens.device)
    offsets = torch.arange(args.seq_len + 1, device=tokens.device)
    tokens_per_step = args.batch_size * args.seq_len
    model.train()
    start = last_time = time.perf_counter()
    loss = torch.zeros(())
    for step in range(num_steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, num_steps, spec.learning_rate)
        # Windows start anywhere in the stream, so a model also learns to begin mid-document.
        windows = tokens[all_starts[step][:, None] + offsets]  # (B, T + 1)
        with autocast(args.device):
            loss = next_token_loss(model, windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % args.log_every == 0 or step + 1 == num_steps:
            now = time.perf_counter()  # .item() waits for the GPU, so the timing is honest
            num_logged = (step % args.log_every) + 1
            print(f"  {spec.name} step {step + 1:5d}/{num_steps}  loss {loss.item():.4f}  "
                  f"lr {optimizer.param_groups[0]['lr']:.2e}  "
                  f"{num_logged * tokens_per_step / (now - last_time):,.0f} tokens/s", flush=True)
            last_time = now
    seconds = time.perf_counter() - start
    return {"steps": num_steps, "train_seconds": round(seconds, 1),
            "train_tokens_per_second": round(num_steps * tokens_per_step / seconds),
            "final_train_loss": round(loss.item(), 4)}


# ---------------------------------------------------------------------------------------------
# 4. Evaluation.

def heldout_windows(tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len + 1 tokens (sharing one token at the seams)."""
    num_windows = (len(tokens) - 1) // seq_len
    starts = torch.arange(num_windows, device=tokens.device) * seq_len
    return tokens[starts[:, None] + torch.arange(seq_len + 1, device=tokens.device)]


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, windows: torch.Tensor, device: str,
             batch_size: int) -> tuple[float, torch.Tensor]:
    """Mean held-out loss, and the model's greedy guess at every position: (N, T)."""
    model.eval()
    total, guesses = 0.0, []
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size]
        with autocast(device):
            logits = model(input_ids=batch[:, :-1]).logits.float()  # (b, T, V)
        total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(),
                                 reduction="sum").item()
        guesses.append(logits.argmax(-1))
    return total / windows[:, 1:].numel(), torch.cat(guesses)


def round_to_float16(model: LlamaForCausalLM) -> None:
    """Round the weights to what the float16 checkpoint will hold, so metrics match it."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


# ---------------------------------------------------------------------------------------------
# 5. Saving.

MODEL_CARD = """# {name}

A tiny Llama-architecture model trained from scratch by minilm-engine on synthetic
noodle-shop text (orders, kitchen tickets, waiter dialogues, receipts, menus, diary notes,
delivery notes) from `minilm_engine.course.noodle_corpus`. It knows nothing outside that shop.

{role}

| | |
|---|---|
| architecture | LlamaForCausalLM, {num_hidden_layers} layers, hidden {hidden_size}, {num_attention_heads} query heads / {num_key_value_heads} kv heads (head_dim {head_dim}), MLP {intermediate_size}, tied embeddings |
| parameters | {num_parameters:,} |
| vocabulary | {vocab_size} byte-level BPE tokens, digits split; `<|endoftext|>` (id {eos_id}) is bos, eos and pad |
| context | 1024 positions (trained on {seq_len}-token windows), rope theta 10000 |
| weights | float16, `model.safetensors` |
| corpus | {num_train_docs:,} train documents ({num_train_tokens:,} tokens, seed {train_seed}); held out: {num_heldout_docs:,} documents ({num_heldout_tokens:,} tokens, seed {heldout_seed}) |
| training | {steps} steps x {batch_size} x {seq_len} tokens, AdamW (peak lr {learning_rate}, warmup + cosine), {precision} on {device_name} in {train_seconds} s |
| held-out loss | {heldout_loss:.4f} (perplexity {heldout_perplexity:.3f}) |
| greedy agreement | the apprentice's greedy guess equals the chef's at {agreement:.1%} of held-out positions |

Reproduce (tokenizer, both models and this card):

    python scripts/train_shipped_models.py {command}
"""


ROLES = {
    CHEF.name: "The target model of the speculative-decoding chapters: the chef, who has the "
               "final say on every token.",
    APPRENTICE.name: "The draft model of the speculative-decoding chapters: the apprentice, who "
                     "guesses the chef's next tokens cheaply. It shares noodle-chef's tokenizer.",
}


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, folder: Path,
         card: str) -> int:
    """Write model.safetensors (float16), config, generation config, tokenizer and README."""
    eos_id = tokenizer.eos_token_id
    model.config.use_cache = True
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id,
                                               pad_token_id=eos_id, do_sample=False)
    # transformers 5 always writes safetensors (the old safe_serialization flag is gone).
    model.to(torch.float16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # transformers 5 writes its own class name ("TokenizersBackend"); the older, still common
    # name loads in transformers 4 (Colab) and 5 alike.
    tok_config_file = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_config_file.read_text())
    tok_config.pop("backend", None)
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_file.write_text(json.dumps(tok_config, indent=2) + "\n")
    (folder / "README.md").write_text(card)
    return (folder / "model.safetensors").stat().st_size


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    command = " ".join(sys.argv[1:]) or "--device cuda"
    print(f"device {device_name}, torch {torch.__version__}, out-dir {args.out_dir}", flush=True)

    start = time.perf_counter()
    train_docs = generate_documents(args.num_train_docs, seed=TRAIN_SEED)
    heldout_docs = generate_documents(args.num_heldout_docs, seed=HELDOUT_SEED)
    print(f"generated {len(train_docs):,} + {len(heldout_docs):,} documents "
          f"({time.perf_counter() - start:.1f} s)", flush=True)
    # The corpus has a small closed vocabulary: 20k documents hold every word, and BPE stops
    # merging (well below --vocab-size) once each word is a single token.
    tokenizer = train_tokenizer(train_docs[:20_000], args.vocab_size)
    print(f"tokenizer: {len(tokenizer)} tokens ({time.perf_counter() - start:.1f} s)", flush=True)
    train_tokens = pack(tokenizer, train_docs).to(args.device)
    heldout = heldout_windows(pack(tokenizer, heldout_docs).to(args.device), args.seq_len)
    if len(heldout) == 0:
        raise SystemExit(f"--num-heldout-docs {args.num_heldout_docs} gives less than one "
                         f"window of {args.seq_len + 1} tokens; ask for more documents")
    print(f"corpus: {len(train_tokens):,} train tokens, {heldout[:, 1:].numel():,} held-out "
          f"tokens ({time.perf_counter() - start:.1f} s)", flush=True)

    report = {"command": f"python scripts/train_shipped_models.py {command}",
              "device": device_name, "torch": torch.__version__,
              "corpus": {"num_train_docs": len(train_docs), "num_train_tokens": len(train_tokens),
                         "train_seed": TRAIN_SEED, "num_heldout_docs": len(heldout_docs),
                         "num_heldout_tokens": heldout[:, 1:].numel(),
                         "heldout_seed": HELDOUT_SEED},
              "vocab_size": len(tokenizer), "batch_size": args.batch_size,
              "seq_len": args.seq_len, "models": {}}
    trained, guesses = [], {}
    for index, (spec, num_steps) in enumerate([(CHEF, args.target_steps),
                                               (APPRENTICE, args.draft_steps)]):
        torch.manual_seed(args.seed + index)
        model = make_model(spec, tokenizer).to(args.device)
        num_parameters = sum(p.numel() for p in model.parameters())  # tied: embedding once
        print(f"training {spec.name}: {num_parameters:,} parameters, {num_steps} steps",
              flush=True)
        stats = train(model, spec, train_tokens, num_steps, args)
        round_to_float16(model)
        loss, guesses[spec.name] = evaluate(model, heldout, args.device, args.batch_size)
        stats.update(num_parameters=num_parameters, heldout_loss=round(loss, 4),
                     heldout_perplexity=round(math.exp(loss), 4), **asdict(spec))
        print(f"  {spec.name}: held-out loss {loss:.4f}, perplexity {math.exp(loss):.3f}",
              flush=True)
        trained.append((spec, model, stats))

    # How often the apprentice's greedy guess is the chef's, on the same held-out text: a
    # teacher-forced estimate of the acceptance rate `a` in (1 - a^(g+1)) / (1 - a).
    agreement = (guesses[CHEF.name] == guesses[APPRENTICE.name]).float().mean().item()
    report["greedy_agreement"] = round(agreement, 4)
    print(f"apprentice agrees with chef on {agreement:.1%} of held-out positions", flush=True)

    for spec, model, stats in trained:
        card = MODEL_CARD.format(
            role=ROLES[spec.name], head_dim=model.config.head_dim, vocab_size=len(tokenizer),
            eos_id=tokenizer.eos_token_id, seq_len=args.seq_len, batch_size=args.batch_size,
            device_name=device_name, command=command, agreement=agreement,
            precision="bf16 autocast" if args.device == "cuda" else "fp32",
            **report["corpus"], **stats)
        folder = args.out_dir / spec.name
        stats["safetensors_bytes"] = save(model, tokenizer, folder, card)
        print(f"saved {folder} ({stats['safetensors_bytes'] / 1e6:.2f} MB)", flush=True)
        report["models"][spec.name] = stats
    report["total_seconds"] = round(time.perf_counter() - start, 1)
    (args.out_dir / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out_dir / 'training_report.json'}; total {report['total_seconds']} s")


if __name__ == "__main__":
    main()
