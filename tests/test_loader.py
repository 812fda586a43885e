"""Tests for minilm_engine.model.loader: a good checkpoint loads, a bad one says what is wrong.

Each broken checkpoint is a copy of a good one (written by `transformers`) with one thing
damaged, and each test checks that the error names that thing: the model type, the file, the
tensor, the shapes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minilm_engine import LLM
from minilm_engine.model import CheckpointError, UnsupportedModelError, load_model, resolve_model_path
from minilm_engine.model.loader import read_config


@pytest.fixture
def copy_of(checkpoints, tmp_path):
    """copy_of(name) -> a private copy of that checkpoint folder, free to damage."""

    def make(name: str = "llama") -> Path:
        return Path(shutil.copytree(checkpoints[name].path, tmp_path / name))

    return make


def rewrite_tensors(file: Path, change) -> None:
    """Load a safetensors file, let `change(tensors)` edit the dict, write it back."""
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


# ---------------------------------------------------------------------- good checkpoints
def test_loads_every_weight_by_name(checkpoint):
    model = load_model(checkpoint.path)
    hf_state = checkpoint.hf_model.state_dict()
    for name, param in model.named_parameters():
        assert torch.equal(param, hf_state[name]), name
    assert not model.training
    assert model.dtype == torch.float32


def test_dtype_argument(checkpoints):
    model = load_model(checkpoints["qwen2"].path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary.inv_freq.dtype == torch.float32  # RoPE frequencies stay exact


def test_sharded_checkpoint_loads(checkpoints, tmp_path):
    ckpt = checkpoints["qwen3"]
    ckpt.hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    assert_same_weights(load_model(tmp_path), load_model(ckpt.path))


def test_missing_shard_is_named(checkpoints, tmp_path):
    checkpoints["qwen3"].hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(tmp_path)


def test_tied_checkpoint_with_a_stored_lm_head_loads(copy_of):
    # Some tied checkpoints store lm_head.weight anyway (a copy of the embedding).
    folder = copy_of("qwen2")
    file = folder / "model.safetensors"
    reference = load_model(folder)

    def add_head(tensors):
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()

    rewrite_tensors(file, add_head)
    assert_same_weights(load_model(folder), reference)


def test_old_checkpoints_with_a_rope_table_load(copy_of):
    folder = copy_of("llama")
    reference = load_model(folder)

    def add_inv_freq(tensors):
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)

    rewrite_tensors(folder / "model.safetensors", add_inv_freq)
    model = load_model(folder)
    assert_same_weights(model, reference)
    # The stored table is ignored: the frequencies come from config.json.
    torch.testing.assert_close(model.model.rotary.inv_freq, reference.model.rotary.inv_freq)


def test_old_style_rope_keys_are_read(checkpoints, copy_of):
    # transformers < 5 wrote `rope_theta` and `rope_scaling` at the top level.
    folder = copy_of("llama3_rope")
    config_file = folder / "config.json"
    raw = json.loads(config_file.read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = params
    config_file.write_text(json.dumps(raw))
    assert read_config(folder) == read_config(checkpoints["llama3_rope"].path)
    assert read_config(folder).rope.rope_type == "llama3"


# ---------------------------------------------------------------------- unsupported models
def test_unknown_model_type_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="'gpt2'") as info:
        load_model(tmp_path)
    message = str(info.value)
    assert "GPT2LMHeadModel" in message  # the architecture, so the user recognises the model
    assert "llama" in message and "qwen3" in message  # and what is supported instead


@pytest.mark.parametrize(
    "change, match",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "'yarn'"),
        ({"num_key_value_heads": 3}, r"num_attention_heads \(4\).*num_key_value_heads \(3\)"),
        ({"sliding_window": 16}, "sliding_window=16"),
    ],
)
def test_unsupported_config_values_are_named(copy_of, change, match):
    folder = copy_of("mistral")
    raw = json.loads((folder / "config.json").read_text())
    raw.update(change)
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match=match):
        load_model(folder)


def test_missing_config_keys_are_listed(copy_of):
    folder = copy_of("llama")
    raw = json.loads((folder / "config.json").read_text())
    del raw["hidden_size"], raw["vocab_size"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match="hidden_size") as info:
        load_model(folder)
    assert "vocab_size" in str(info.value)


# ---------------------------------------------------------------------- broken folders and files
def test_missing_config_json(copy_of):
    folder = copy_of()
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(folder)


def test_config_json_that_is_not_json(copy_of):
    folder = copy_of()
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        load_model(folder)


def test_folder_without_safetensors(copy_of):
    folder = copy_of()
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors") as info:
        load_model(folder)
    assert "pytorch_model.bin" in str(info.value)  # says what it found instead


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0])
def test_truncated_safetensors_file(copy_of, keep):
    folder = copy_of()
    file = folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(folder)


def test_garbage_safetensors_file(copy_of):
    folder = copy_of()
    (folder / "model.safetensors").write_bytes(b"\xff" * 1000)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(folder)


@pytest.mark.parametrize(
    "name",
    ["model.layers.1.self_attn.k_proj.weight", "model.norm.weight", "lm_head.weight"],
)
def test_missing_tensor_is_named(copy_of, name):
    folder = copy_of("llama")  # untied, so lm_head.weight is required
    rewrite_tensors(folder / "model.safetensors", lambda tensors: tensors.pop(name))
    with pytest.raises(CheckpointError, match="missing tensors") as info:
        load_model(folder)
    assert name in str(info.value)


def test_many_missing_tensors_are_summarised(copy_of):
    folder = copy_of("llama")
    rewrite_tensors(
        folder / "model.safetensors",
        lambda tensors: [tensors.pop(k) for k in list(tensors) if ".layers.1." in k],
    )
    with pytest.raises(CheckpointError, match=r"and \d+ more"):
        load_model(folder)


def test_misshaped_tensor_names_tensor_and_both_shapes(copy_of):
    folder = copy_of("mistral")
    name = "model.layers.0.self_attn.k_proj.weight"  # (1 kv head x 16, 32)

    def reshape(tensors):
        tensors[name] = torch.zeros(32, 32)

    rewrite_tensors(folder / "model.safetensors", reshape)
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    message = str(info.value)
    assert name in message and "(32, 32)" in message and "(16, 32)" in message
    assert "model.safetensors" in message


def test_unexpected_tensor_is_named(copy_of):
    folder = copy_of("llama")

    def add_bias(tensors):
        tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)

    rewrite_tensors(folder / "model.safetensors", add_bias)
    name = r"'model\.layers\.0\.self_attn\.q_proj\.bias'"
    with pytest.raises(CheckpointError, match="unexpected tensor " + name):
        load_model(folder)


# ---------------------------------------------------------------------- finding the folder
def test_resolve_existing_folder(checkpoints):
    path = checkpoints["llama"].path
    assert resolve_model_path(str(path)) == path.resolve()
    assert resolve_model_path(path) == path.resolve()


@pytest.mark.parametrize(
    "name", ["no-such-model", "./no/such/folder", "a/b/c", "/definitely/not/here"]
)
def test_unknown_path_or_name(name):
    with pytest.raises(CheckpointError, match="not found") as info:
        resolve_model_path(name)
    # What transformers users already catch: a missing model is a FileNotFoundError.
    assert isinstance(info.value, FileNotFoundError)


def test_checkpoint_errors_are_os_errors(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    for folder, message in [(tmp_path / "empty", "no config.json"), (tmp_path, "not valid JSON")]:
        folder.mkdir(exist_ok=True)
        with pytest.raises(OSError, match=message) as info:
            read_config(folder)
        assert isinstance(info.value, CheckpointError) and not isinstance(info.value, FileNotFoundError)


def test_file_instead_of_folder(checkpoints):
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_model_path(checkpoints["llama"].path / "config.json")


def test_llm_reports_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="no config.json"):
        LLM(tmp_path)  # an empty folder
