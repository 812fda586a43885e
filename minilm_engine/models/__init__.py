"""Models: configuration, the decoder, and the checkpoint loader."""

from .config import ModelConfig, UnsupportedModelError
from .decoder import CausalLM
from .loader import CheckpointError, CheckpointNotFoundError, load_model, resolve_model_path

__all__ = [
    "CausalLM",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ModelConfig",
    "UnsupportedModelError",
    "load_model",
    "resolve_model_path",
]
