"""Chapter 06's exercise: group-wise INT4 quantize-then-dequantize, checked two ways.

Contract: `int4_exercise.check(fn)` calls `fn(w, group_size)` on random weight matrices (a
seeded generator draws shapes, shifts and outliers; nothing to copy from) and expects the
(N, K) float tensor the INT4 scheme of `model/quantization/schemes.py` gives back: asymmetric, one
scale and offset per group of `group_size` inputs, codes 0..15.  It reports the first case
that fails, in words: a wrong type or shape, an error above half a step (the bound every
round-to-nearest code must meet), or a result within the bound that is not quantized (more
than 16 values in a group).  Any quantizer that meets both passes, not only the package's
recipe (a zero point rounded to a code passes too).  The package's own functions, passed or
called, get a nudge, not a pass (as `build.check`).  It never raises on a wrong answer.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from minilm_engine.model.quantization import QuantizationConfig
from minilm_engine.model.quantization import schemes
from minilm_engine.course.teaching.exercises import CallWatch, CheckResult, _unwrap, nudge, package_functions

# The package's functions that answer the exercise: passing one, or calling one, gets a nudge.
PACKAGE = (
    "minilm_engine.course.teaching.exercises_quantization:reference_int4",
    "minilm_engine.model.quantization.schemes:int4_params",
    "minilm_engine.model.quantization.schemes:quantize_int4",
    "minilm_engine.model.quantization.schemes:dequantize_int4",
)
HINT = ("16 levels are few: spend them on the range each small group of inputs really covers, from its lowest "
        "value to its highest, and round each weight to the nearest level.")


def reference_int4(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """The package's answer: quantize to INT4 codes, then dequantize."""
    scales, offsets = schemes.int4_params(w, group_size)
    codes = schemes.quantize_int4(w, scales, offsets, group_size)
    return schemes.dequantize_int4(codes, scales, offsets, w.shape[1])


def _case(rng: random.Random) -> dict[str, Any]:
    group_size = rng.choice([32, 64, 128])
    N, K = rng.randint(1, 6), group_size * rng.randint(1, 3)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    w = torch.randn(N, K, generator=generator) * rng.choice([0.02, 1.0, 30.0]) + rng.uniform(-1, 1)
    if rng.random() < 0.5:  # an outlier somewhere
        w[rng.randrange(N), rng.randrange(K)] *= 20
    return {"w": w, "group_size": group_size}


class Int4Exercise:
    name = "int4 quantize-dequantize"
    reference = staticmethod(reference_int4)

    def hint(self) -> str:
        return HINT

    def check(self, fn, num_cases: int = 30, seed: int = 0) -> CheckResult:
        own = package_functions(PACKAGE)
        if _unwrap(fn) in own:  # the package's own answer: a nudge, not a pass (as build.check)
            return CheckResult(False, 0, nudge(self.name, own[_unwrap(fn)], HINT))
        rng = random.Random(seed)
        for i in range(num_cases):
            case = _case(rng)
            w, g = case["w"], case["group_size"]
            shape = f"w of shape {tuple(w.shape)}, group_size={g}"
            try:
                with CallWatch(own) as watch:
                    got = fn(w.clone(), g)
                if watch.called:
                    return CheckResult(False, i, nudge(self.name, watch.called[0], HINT) + " (your function calls it.)")
            except NotImplementedError:
                return CheckResult(False, i, f"{self.name}: not implemented yet")
            except Exception as e:  # the learner's bug, reported rather than raised
                return CheckResult(False, i, f"{self.name} raised {type(e).__name__}: {e} (on {shape})")
            if not isinstance(got, torch.Tensor):
                return CheckResult(False, i, f"{self.name}: returned a {type(got).__name__}, expected a "
                                             f"torch.Tensor of shape {tuple(w.shape)} (on {shape})")
            if tuple(got.shape) != tuple(w.shape):
                return CheckResult(False, i, f"{self.name}: returned shape {tuple(got.shape)}, expected "
                                             f"{tuple(w.shape)}: one dequantized value per weight (on {shape})")
            got = got.detach().float()
            if not torch.isfinite(got).all():
                return CheckResult(False, i, f"{self.name}: the result has NaN or inf (on {shape}); "
                                             "a group whose values are all equal has max - min = 0")
            step = schemes.int4_params(w, g)[0].repeat_interleave(g, dim=1)  # each weight's step
            excess = (got - w).abs() - step / 2
            if (excess > 1e-4 * (1 + w.abs())).any():
                n, k = divmod(int(excess.argmax()), w.shape[1])
                return CheckResult(
                    False, i,
                    f"{self.name}: weight [{n}, {k}] is off by {float((got - w)[n, k].abs()):.4g}, more "
                    f"than half a step ({float(step[n, k]) / 2:.4g}) of its group [{k // g}] (on {shape}). "
                    "Step = (max - min) / 15 of the group, offset = min, code = round((w - min) / step) "
                    "clamped to 0..15.",
                )
            # Any quantizer within the bound passes (a zero point rounded to a code, another
            # rounding of ties): what it may not do is keep more than 16 values per group.
            groups = got.view(w.shape[0], -1, g)
            levels = max(len(torch.unique(groups[n, j])) for n in range(groups.shape[0]) for j in range(groups.shape[1]))
            if levels > schemes.INT4_LEVELS + 1:
                return CheckResult(
                    False, i,
                    f"{self.name}: within half a step everywhere, but not the scheme's rounding: a group takes "
                    f"{levels} distinct values and 4 bits hold 16 (on {shape}). Round each weight to one of its "
                    "group's 16 levels: use one scale and offset per group of consecutive inputs along a row "
                    "(dim 1), min-max, 16 levels.",
                )
        return CheckResult(True, num_cases, f"{self.name}: all {num_cases} random cases use 16 levels per "
                                            "group and stay within half a step")

    def solution(self):
        """The package's own implementation, folded (click to reveal)."""
        import html
        import inspect

        from IPython.display import HTML

        source = "\n\n".join(inspect.getsource(f) for f in (
            schemes.int4_params, schemes.quantize_int4, schemes.dequantize_int4, reference_int4))
        return HTML(f"<details><summary>Show the solution (model/quantization/schemes.py)</summary>"
                    f"<pre>{html.escape(source)}</pre></details>")


int4_exercise = Int4Exercise()
__all__ = ["int4_exercise", "reference_int4", "QuantizationConfig"]
