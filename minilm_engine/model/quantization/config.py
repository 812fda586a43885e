"""What to quantize and how: `QuantizationConfig`, checked once at the boundary.

Contract: `QuantizationConfig.from_user(scheme, options)` turns what `LLM(...,
quantization=..., quantization_config={...})` received into a consistent config or raises a
`QuantizationError` that names the bad value and what is allowed.  `to_checkpoint_dict()` is
the `quantization_config` entry written into a quantized checkpoint's config.json, and
`from_checkpoint_dict()` reads it back (run-time choices, the kernel and the calibration text,
are not part of a checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

SCHEMES = ("int8", "int4")
METHODS = ("rtn", "awq")  # round to nearest; activation-aware scale (and clip) search
GROUP_SIZES = (32, 64, 128)
KERNELS = ("auto", "reference", "cpu", "triton")
CHECKPOINT_FORMAT = "minilm-weight-only"  # the quant_method written to config.json
SCALE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class QuantizationError(ValueError):
    """A quantization request that cannot be honoured (scheme, group size, checkpoint...)."""


@dataclass(frozen=True)
class QuantizationConfig:
    scheme: str  # "int8" (per output channel) or "int4" (group-wise, two codes per byte)
    group_size: int | None = 128  # int4 only: inputs sharing one scale and offset
    method: str = "rtn"  # "rtn" or "awq" (needs calibration text)
    # Calibration text for "awq": None = held-out noodle-shop documents (calibration.py).
    calibration_texts: tuple[str, ...] | None = None
    max_calibration_tokens: int = 4096
    # int4: pad rows whose length is not a multiple of group_size (else it is an error)
    pad_in_features: bool = True
    kernel: str = "auto"  # which matmul runs: see kernels/__init__.py
    scale_dtype: str = "float32"  # scales and offsets are rounded to what this dtype holds
    # Quantize the LM head too (round to nearest, the same scheme).  A tied input embedding
    # keeps its full-precision table: a lookup reads one row per token, the head reads all.
    lm_head: bool = False

    @property
    def bits(self) -> int:
        return 8 if self.scheme == "int8" else 4

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return SCALE_DTYPES[self.scale_dtype]

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise QuantizationError(f"unknown quantization scheme {self.scheme!r}; "
                                    f"supported: {', '.join(SCHEMES)}")
        if self.scheme == "int8" and self.group_size is not None:
            raise QuantizationError(f"int8 has one scale per output channel; group_size="
                                    f"{self.group_size!r} is for int4")
        if self.scheme == "int4" and self.group_size not in GROUP_SIZES:
            raise QuantizationError(f"int4 group_size must be one of {GROUP_SIZES}, "
                                    f"got {self.group_size!r}")
        choices = {"method": METHODS, "kernel": KERNELS, "scale_dtype": tuple(SCALE_DTYPES)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise QuantizationError(f"{name} must be one of {allowed}, "
                                        f"got {getattr(self, name)!r}")
        texts = self.calibration_texts
        if texts is not None and (isinstance(texts, str)
                                  or not all(isinstance(t, str) for t in texts)
                                  or not any(t.strip() for t in texts)):
            raise QuantizationError("calibration_texts must be a non-empty list of strings "
                                    "(not one string)")
        n = self.max_calibration_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 16:
            raise QuantizationError(f"max_calibration_tokens must be an int >= 16, got {n!r}")
        for name in ("lm_head", "pad_in_features"):
            if not isinstance(getattr(self, name), bool):
                raise QuantizationError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def from_user(cls, scheme: Any, options: dict[str, Any] | None) -> QuantizationConfig:
        """From LLM(quantization=scheme, quantization_config=options)."""
        options = dict(options or {})
        if not isinstance(scheme, str):
            raise QuantizationError(f"quantization must be one of {SCHEMES} or None, got {scheme!r}")
        known = set(cls.__dataclass_fields__) - {"scheme"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise QuantizationError(f"unknown quantization_config keys {unknown}; "
                                    f"known keys: {sorted(known)}")
        if scheme == "int8":
            options.setdefault("group_size", None)
        if options.get("calibration_texts") is not None:
            texts = options["calibration_texts"]
            options["calibration_texts"] = texts if isinstance(texts, str) else tuple(texts)
        return cls(scheme=scheme, **options)

    def with_runtime(self, options: dict[str, Any] | None) -> QuantizationConfig:
        """A loaded checkpoint's config with run-time options (only `kernel`) applied."""
        options = dict(options or {})
        fixed = sorted(set(options) - {"kernel"})
        if fixed:
            raise QuantizationError(f"this checkpoint is already quantized ({self.describe()}); "
                                    f"only 'kernel' can be chosen when loading it, not {fixed}")
        return replace(self, **options)

    def describe(self) -> str:
        group = f", group_size={self.group_size}" if self.scheme == "int4" else ""
        head = ", lm_head" if self.lm_head else ""
        return f"{self.scheme}{group}, method={self.method}{head}"

    def to_checkpoint_dict(self) -> dict[str, Any]:
        return {"quant_method": CHECKPOINT_FORMAT, "scheme": self.scheme, "bits": self.bits,
                "group_size": self.group_size, "method": self.method,
                "pad_in_features": self.pad_in_features, "scale_dtype": self.scale_dtype,
                "lm_head": self.lm_head}

    @classmethod
    def from_checkpoint_dict(cls, d: dict[str, Any]) -> QuantizationConfig:
        if d.get("quant_method") != CHECKPOINT_FORMAT:
            raise QuantizationError(f"config.json has a quantization_config with quant_method "
                                    f"{d.get('quant_method')!r}; this engine reads only its own "
                                    f"format ({CHECKPOINT_FORMAT!r}, written by `minilm-engine "
                                    "quantize`)")
        return cls(scheme=d["scheme"], group_size=d.get("group_size"),
                   method=d.get("method", "rtn"), pad_in_features=d.get("pad_in_features", True),
                   scale_dtype=d.get("scale_dtype", "float32"), lm_head=d.get("lm_head", False))
