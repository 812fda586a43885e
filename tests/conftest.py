"""Shared fixtures: tiny random checkpoints written by `transformers` itself, with a real tokenizer.

Every checkpoint is what a user would download, only tiny: `config.json`, `model.safetensors`,
`generation_config.json` and the tokenizer files, all produced by `save_pretrained`.  The
families together cover what the decoder must get right:

    name          family   heads/kv  ratio  head_dim (hidden/heads)  tied  extra
    llama         llama    4/4       1      8 (8)                    no    -
    llama3_rope   llama    6/3       2      8 (8)                    yes   llama3 rope scaling
    mistral       mistral  4/1       4      16 (8)                   no    sliding_window > context
    qwen2         qwen2    4/2       2      16 (16)                  yes   q/k/v bias, theta 1e6
    qwen3         qwen3    8/2       4      8 (4)                    no    q/k RMSNorm

`initializer_range` is large (0.2) so the logits are peaked: greedy decoding then has no
near-ties that float noise could flip, and comparisons with `transformers` are exact.  Norm
weights and biases are randomised too (Hugging Face initialises them to 1 and 0, which would
hide a missing bias or norm).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels are tested in Triton's CPU interpreter, which must be switched
# on before anything imports triton (transformers does, through torch._dynamo): here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests compare with `transformers` exactly, in fp32, so engines whose device is not given run on
# the CPU even on a GPU machine; the GPU tests (Triton kernels, CUDA graphs) name their device.
os.environ.setdefault("MINILM_DEVICE", "cpu")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine the OpenMP
# workers wait on busy cores: one thread makes a decode step ~20x faster here.
torch.set_num_threads(1)

EOS = "<|endoftext|>"
TOKENIZER_VOCAB_SIZE = 400
MAX_POSITIONS = 256

FAMILY_CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}

# name -> (family, config overrides).  See the table in the module docstring.
CHECKPOINT_SPECS: dict[str, tuple[str, dict]] = {
    "llama": (
        "llama",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        ),
    ),
    "llama3_rope": (
        "llama",
        dict(
            hidden_size=48,
            num_attention_heads=6,
            num_key_value_heads=3,
            tie_word_embeddings=True,
            # head_dim 8 at theta 1e4 gives wavelengths 6, 63, 628, 6283: with an original
            # context of 128 that is one kept, one interpolated and two scaled frequencies.
            rope_scaling={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        ),
    ),
    "mistral": (
        "mistral",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=False,
            sliding_window=4096,  # wider than the context: full attention, as we do
        ),
    ),
    "qwen2": (
        "qwen2",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_theta=1_000_000.0,
        ),
    ),
    "qwen3": (
        "qwen3",
        dict(
            hidden_size=32,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=False,
        ),
    ),
}
CHECKPOINT_NAMES = list(CHECKPOINT_SPECS)


def corpus_texts() -> list[str]:
    """English text to train the tokenizer on: the noodle corpus when the package has it."""
    try:
        from minilm_engine.course.noodle_corpus import generate_documents
    except ImportError:  # pragma: no cover - the corpus module is optional for these tests
        words = "the quick brown fox jumps over a lazy dog while noodles simmer in broth".split()
        rng = random.Random(0)
        return [" ".join(rng.choice(words) for _ in range(60)) for _ in range(300)]
    return generate_documents(300, seed=0)


def train_tokenizer(
    texts: list[str], vocab_size: int = TOKENIZER_VOCAB_SIZE
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 / Llama 3 / Qwen style) with one special token, the EOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, clean_up_tokenization_spaces=False
    )


def hf_config(family: str, vocab_size: int, eos_token_id: int, **overrides):
    config_cls, _ = FAMILY_CLASSES[family]
    kwargs = dict(
        vocab_size=vocab_size,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
    )
    kwargs.update(overrides)
    return config_cls(**kwargs)


def build_hf_model(family: str, config, seed: int = 0) -> torch.nn.Module:
    """A random `transformers` model with every parameter (norms and biases too) non-trivial."""
    _, model_cls = FAMILY_CLASSES[family]
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.2 * torch.randn_like(param))
    return model


@dataclass
class Checkpoint:
    """A checkpoint folder and the `transformers` model that wrote it (fp32, eager attention)."""

    name: str
    family: str
    path: Path
    hf_model: torch.nn.Module
    tokenizer: PreTrainedTokenizerFast

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(corpus_texts())


def save_checkpoint(folder: Path, model, tokenizer, **save_kwargs) -> Path:
    model.save_pretrained(folder, **save_kwargs)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tokenizer) -> dict[str, Checkpoint]:
    """Every checkpoint of CHECKPOINT_SPECS, saved once per test session."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for seed, (name, (family, overrides)) in enumerate(CHECKPOINT_SPECS.items()):
        config = hf_config(family, len(tokenizer), tokenizer.eos_token_id, **overrides)
        model = build_hf_model(family, config, seed=seed)
        folder = save_checkpoint(root / name, model, tokenizer)
        # Read it back the way a user would, so the reference is what the files say.
        reloaded = AutoModelForCausalLM.from_pretrained(
            folder, attn_implementation="eager", dtype=torch.float32
        ).eval()
        out[name] = Checkpoint(name, family, folder, reloaded, tokenizer)
    return out


@pytest.fixture(params=CHECKPOINT_NAMES)
def checkpoint(request, checkpoints) -> Checkpoint:
    """Each checkpoint in turn."""
    return checkpoints[request.param]


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    """Five prompts of different lengths (tokens: a few to a few dozen)."""
    return [
        "Order for table 7:",
        "Hello",
        "The Golden Bowl is open every day from eleven until late, and the miso ramen",
        "Receipt\nMiso Ramen @ $",
        "A bowl of noodles, please.",
    ]


@pytest.fixture(scope="session")
def cpu_microkernel():
    """The compiled CPU micro-kernel (model/quantization/kernels/cpu_microkernel.cpp), built once.
    Where it cannot be built: a skip, or a failure under MINILM_REQUIRE_MICROKERNEL=1 (CI sets
    it, so a broken build cannot hide behind skips)."""
    from minilm_engine.model.quantization.kernels import cpu_compiled

    module = cpu_compiled.load()
    if module is None:
        reason = f"the CPU micro-kernel cannot be built here: {cpu_compiled.unavailable_reason()}"
        if os.environ.get("MINILM_REQUIRE_MICROKERNEL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return module
