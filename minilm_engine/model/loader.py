"""Find a checkpoint and load it into `CausalLM`.

Contract: `resolve_model_path(model)` turns what a user typed into a local folder: `None` or a
shipped name ("noodle-chef", "noodle-apprentice") -> the models inside this package; an existing
folder -> itself; "org/name" -> a Hugging Face hub snapshot (downloaded when online, from the
local hub cache otherwise).  `load_model(folder, dtype, device)` reads `config.json` and the
`*.safetensors` files, copies every tensor by its Hugging Face name, and raises an error that
names the file, the tensor and the shapes whenever something does not fit.
"""

from __future__ import annotations

import json
import functools
from pathlib import Path

import torch

from minilm_engine.model.config import ModelConfig
from minilm_engine.model.decoder import CausalLM
from minilm_engine.model.rope import inverse_frequencies

CHECKPOINTS_DIR = Path(__file__).resolve().parent.parent / "checkpoints"
SHIPPED_MODELS = ("noodle-chef", "noodle-apprentice")
DEFAULT_MODEL = "noodle-chef"


class CheckpointError(OSError):
    """A checkpoint folder or file is missing, corrupt, or does not match its config (an
    `OSError`, as `transformers` raises)."""

class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The model names nothing there is: no folder, no shipped model, no hub id."""


def resolve_model_path(model: str | Path | None = None) -> Path:
    """Return the local folder holding `config.json` for `model` (see the module docstring)."""
    if model is None:
        model = DEFAULT_MODEL
    if str(model) in SHIPPED_MODELS:
        return CHECKPOINTS_DIR / str(model)
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise CheckpointError(f"{path} is a file; pass the folder that holds config.json")
    name = str(model)
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return _download_from_hub(name)
    raise CheckpointNotFoundError(
        f"model {name!r} not found: it is not a folder, not a shipped model "
        f"({', '.join(SHIPPED_MODELS)}), and not a hub id of the form 'org/name'"
    )


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as online_error:  # offline, unknown repo, gated model...
        try:  # a copy may already sit in the local hub cache
            return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
        except Exception:
            raise CheckpointError(
                f"could not get {repo_id!r} from the Hugging Face hub "
                f"({type(online_error).__name__}: {online_error}); pass a local folder instead"
            ) from online_error


def read_config(folder: Path) -> ModelConfig:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_file} is not valid JSON: {e}") from e
    return ModelConfig.from_hf_dict(raw)


def read_quantization_config(folder: Path):
    """The `quantization_config` entry of config.json as a QuantizationConfig, or None."""
    raw = json.loads((folder / "config.json").read_text())
    if "quantization_config" not in raw:
        return None
    from minilm_engine.model.quantization.config import QuantizationConfig

    return QuantizationConfig.from_checkpoint_dict(raw["quantization_config"])


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(p.name for p in folder.iterdir()) or "nothing"
        raise CheckpointError(
            f"{folder} holds no *.safetensors weights (found: {found}); "
            "only safetensors checkpoints are supported"
        )
    return files


def load_model(
    folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> CausalLM:
    """Build the model described by `folder/config.json` and fill it from its safetensors."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    config = read_config(folder)
    quantization = read_quantization_config(folder)
    # Build on the meta device (no memory, no random init), then materialise on the target.
    with torch.device("meta"):
        model = CausalLM(config)
        if quantization is not None:  # the projections hold codes and scales, not weights
            from minilm_engine.model.quantization.linear import empty_quantized_model

            empty_quantized_model(model, quantization)
            model.quantization_config = quantization
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()  # materialising gave the tied pair two separate tensors
    model.model.rotary.inv_freq = inverse_frequencies(config.rope, config.head_dim).to(device)
    expected = dict(model.named_parameters())  # tied lm_head appears once, as embed_tokens
    persistent = model.state_dict(keep_vars=True)
    expected.update({n: b for n, b in model.named_buffers() if n in persistent})  # quantized codes
    loaded: set[str] = set()
    for file in safetensors_files(folder):
        if not file.is_file():
            raise CheckpointError(f"{file} is listed in the index but missing")
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name not in expected:
                        if _ignorable(name, config):
                            continue
                        raise CheckpointError(
                            f"{file.name}: unexpected tensor {name!r}; this checkpoint does not "
                            f"match a {config.model_type} decoder"
                        )
                    tensor = f.get_tensor(name)
                    param = expected[name]
                    if tuple(tensor.shape) != tuple(param.shape):
                        raise CheckpointError(
                            f"{file.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"config.json implies {tuple(param.shape)}"
                        )
                    if tensor.dtype != param.dtype and not param.is_floating_point():
                        raise CheckpointError(
                            f"{file.name}: tensor {name!r} is {tensor.dtype}, expected {param.dtype}"
                        )
                    with torch.no_grad():
                        param.copy_(tensor)
                    loaded.add(name)
        except SafetensorError as e:
            raise CheckpointError(f"{file} is not a readable safetensors file: {e}") from e
        except OSError as e:
            raise CheckpointError(f"could not read {file}: {e}") from e
    missing = sorted(set(expected) - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"{folder}: checkpoint is missing tensors: {shown}")
    return model.eval()


def _ignorable(name: str, config: ModelConfig) -> bool:
    # Old checkpoints store the RoPE table; tied checkpoints sometimes store lm_head anyway.
    return name.endswith("rotary_emb.inv_freq") or (
        name == "lm_head.weight" and config.tie_word_embeddings
    )


@functools.cache
def shipped_corpus_sample() -> dict[str, list[str]]:
    """A fixed sample of the text the shipped models were trained on (`documents`, and held-out
    `calibration` ones), written by `course/noodle_corpus.py`: the bench's "noodle" dataset and
    the default calibration read it."""
    return json.loads((CHECKPOINTS_DIR / "noodle_corpus_sample.json").read_text())
