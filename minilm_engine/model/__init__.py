"""Models: configuration, the decoder, and the checkpoint loader."""

from minilm_engine.model.config import ModelConfig, UnsupportedModelError
from minilm_engine.model.decoder import CausalLM
from minilm_engine.model.loader import (
    CheckpointError, CheckpointNotFoundError, load_model, resolve_model_path,
)

__all__ = ["CausalLM", "CheckpointError", "CheckpointNotFoundError", "ModelConfig",
           "UnsupportedModelError", "load_model", "resolve_model_path"]
