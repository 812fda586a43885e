"""The setup every chapter runs first, and `show_source` for reading the package in place.

Contract: `setup()` picks the device (CUDA when present), the model (the shipped noodle-chef on a
CPU or offline; a real Hugging Face model on a GPU when it can be downloaded; `MINILM_MODEL`
overrides both) and the size of the experiments (`MINILM_SMOKE=1`, as CI sets it, shrinks
them), prints what it chose (with the attention path "auto" takes and why, and how figures are
drawn: PNG under MINILM_STATIC_FIGURES=1, live views otherwise), and returns it.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch

from minilm_engine.model.device import resolve_device, resolve_dtype

GPU_MODEL = "Qwen/Qwen3-0.6B"


@dataclass
class NotebookSetup:
    device: str
    dtype: str
    model: str | None  # None = the shipped default (noodle-chef)
    smoke: bool  # small experiment sizes (CI)

    def size(self, full: int, smoke: int) -> int:
        """Pick an experiment size: `smoke` under MINILM_SMOKE=1, else `full`."""
        return smoke if self.smoke else full


def setup(gpu_model: str = GPU_MODEL, verbose: bool = True) -> NotebookSetup:
    smoke = os.environ.get("MINILM_SMOKE", "0") == "1"
    device = resolve_device(None)  # $MINILM_DEVICE, else CUDA when present
    if device.type == "cpu":
        # A 7M-parameter model's matmuls are too small to split across threads, and on a busy
        # machine torch's spinning worker threads make each step 10-30x slower (measured on
        # the 2-core CI machine).  One thread by default; MINILM_THREADS=N to change.
        torch.set_num_threads(int(os.environ.get("MINILM_THREADS", "1")))
    dtype = resolve_dtype("auto", device)
    model = os.environ.get("MINILM_MODEL") or None
    if model is None and device.type == "cuda":
        model = _hub_model_if_reachable(gpu_model)
    chosen = NotebookSetup(str(device), str(dtype).removeprefix("torch."), model, smoke)
    static = os.environ.get("MINILM_STATIC_FIGURES", "0") == "1"
    if static:  # figures as PNG images, which GitHub shows in committed outputs
        from minilm_engine.course.viz.static_png import use_png_renderer

        use_png_renderer()
    if verbose:
        print(
            f"device: {chosen.device}  dtype: {chosen.dtype}  "
            f"model: {chosen.model or 'noodle-chef (shipped)'}  smoke: {chosen.smoke}  "
            f"torch threads: {torch.get_num_threads()}"
        )
        print(f"attention: {attention_summary(device, dtype)}  figures: {figure_summary(static)}")
    return chosen


def attention_summary(device: torch.device, dtype: torch.dtype) -> str:
    """Which attention the engine's "auto" picks here, and why the Triton kernels do not run
    when they do not (a T4: compute capability 7.5, which Triton >= 3.3 no longer supports)."""
    from minilm_engine.model.attention.backends import triton_unavailable_reason

    if device.type != "cuda":
        return "torch reference (the Triton kernels are for CUDA GPUs)"
    reason = triton_unavailable_reason(device, dtype)
    return "triton kernels" if reason is None else f"torch reference, because {reason}"


def figure_summary(static: bool) -> str:
    from minilm_engine.course.viz.frontend import in_colab, live_renderer

    if static:
        return "static PNG (MINILM_STATIC_FIGURES=1)"
    where = "Colab" if in_colab() else "Jupyter"
    return f"live {live_renderer()} views ({where})"


def _hub_model_if_reachable(repo_id: str) -> str | None:
    from minilm_engine.model.loader import CheckpointError, resolve_model_path

    try:
        resolve_model_path(repo_id)
        return repo_id
    except CheckpointError as e:
        print(f"({repo_id} not available: {e}; using the shipped model)")
        return None


def show_source(obj, lines: tuple[int, int] | None = None):
    """Display the source of a package function or class, as the package has it."""
    from IPython.display import Code

    source = inspect.getsource(obj)
    if lines is not None:
        source = "\n".join(source.splitlines()[lines[0] : lines[1]])
    module = inspect.getmodule(obj)
    header = f"# {module.__name__}.{getattr(obj, '__qualname__', '')}\n" if module else ""
    return Code(header + source, language="python")
