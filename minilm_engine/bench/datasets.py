"""The requests a serving benchmark sends: noodle-shop prompts or a JSONL file.

Contract: `noodle_requests` and `jsonl_requests` return `BenchRequest`s, the same for the same
arguments on every machine.  Lengths are uniform in [L * (1 - r), L * (1 + r)] (vLLM's
--random-range-ratio).  With an input length, a noodle prompt is corpus text cut to that many
tokens (4 characters a token without a tokenizer); without, a document's first line.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from minilm_engine.model.loader import shipped_corpus_sample

CHARS_PER_TOKEN = 4  # estimate when no tokenizer is at hand (English text, BPE)


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    max_tokens: int


def draw_length(rng: random.Random, length: int, range_ratio: float) -> int:
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    low, high = round(length * (1 - range_ratio)), round(length * (1 + range_ratio))
    return max(1, rng.randint(low, high))


def _cut(document: str, num_tokens: int, tokenizer) -> str:
    if tokenizer is None:
        return document[: num_tokens * CHARS_PER_TOKEN]
    ids = tokenizer.encode(document, add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids)


def noodle_requests(num_requests: int, output_len: int = 32, input_len: int | None = None,
                    range_ratio: float = 0.0, seed: int = 0, tokenizer=None) -> list[BenchRequest]:
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if output_len < 1 or (input_len is not None and input_len < 1):
        raise ValueError(f"lengths must be >= 1, got input {input_len}, output {output_len}")
    rng = random.Random(seed)
    sample = shipped_corpus_sample()
    documents = sample["documents"]
    if input_len is None:
        prompts = [rng.choice(sample["prompts"]) for _ in range(num_requests)]
    else:
        prompts = []
        for _ in range(num_requests):
            # Documents long enough to cut: join a few so that even long inputs have text.
            text = ""
            while len(text) < input_len * CHARS_PER_TOKEN * 2:
                text += rng.choice(documents)
            prompts.append(_cut(text, draw_length(rng, input_len, range_ratio), tokenizer))
    return [BenchRequest(p, draw_length(rng, output_len, range_ratio)) for p in prompts]


def jsonl_requests(path: str | Path, num_requests: int | None = None, output_len: int = 32,
                   range_ratio: float = 0.0, seed: int = 0) -> list[BenchRequest]:
    """One request per line: {"prompt": "...", "max_tokens": N (optional: else drawn)}."""
    rng = random.Random(seed)
    requests = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"{path}:{number}: expected an object with a string 'prompt'")
        max_tokens = item.get("max_tokens", item.get("output_len"))
        if max_tokens is None:
            max_tokens = draw_length(rng, output_len, range_ratio)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"{path}:{number}: max_tokens must be a positive int, got {max_tokens!r}")
        requests.append(BenchRequest(item["prompt"], max_tokens))
    if not requests:
        raise ValueError(f"{path} holds no requests")
    if num_requests is not None:
        # Cycle through the file when more requests are asked than it holds.
        requests = [requests[i % len(requests)] for i in range(num_requests)]
    return requests
