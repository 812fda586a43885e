"""llama.cpp as a baseline for `cpu_decode.py`: the same checkpoint as GGUF, timed through llama-cpp-python.

Contract: `llama_cpp_skip_reason()` says why llama.cpp cannot run here (None: it can);
`build_ggufs(folder, out_dir, converter_dir, threads)` turns the engine's checkpoint folder into
bf16, Q8_0 and Q4_0 GGUF files with llama.cpp's own tools, and `llama_cpp_step_ms(path, ...)`
returns a function that times greedy batch-1 decode of one of them, the way `cpu_decode.py`
times the engine (the mean gap between tokens after the prefill).

    checkpoint folder ─ convert_hf_to_gguf.py (llama.cpp's converter, --outtype bf16) ─ bf16.gguf
    bf16.gguf ─ llama_model_quantize (llama.cpp's C API, through llama_cpp) ─ q8_0.gguf, q4_0.gguf

Where the converter comes from: the llama-cpp-python wheel does not ship `convert_hf_to_gguf.py`,
its source distribution does (vendor/llama.cpp/, with the `gguf-py` it was written against).
`find_converter` takes, in order, `--llama-cpp-source DIR` / `$LLAMA_CPP_SOURCE` (a llama.cpp
checkout), an sdist already unpacked in the cache, or runs `pip download --no-binary :all:
--no-deps llama-cpp-python==<the installed version>` and unpacks it there, so the converter is
the one of the library that runs the model.

One change to the converter's run, and why: the random checkpoint carries the shipped chef's
small BPE tokenizer, whose pre-tokenizer hash the converter does not know (it raises "BPE
pre-tokenizer was not recognized"); we name it "gpt-2" (the same regex family).  That only
labels the vocabulary in the GGUF: the benchmark feeds token ids, never text, and the weights
are converted untouched.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minilm-engine" / "llama-cpp"
# GGUF name -> llama.cpp's file type (enum llama_ftype); bf16 is what the converter writes.
QUANT_TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}

# Run in a subprocess with the converter's folder first on sys.path: its own `conversion`
# package and `gguf-py`, not whatever gguf is installed.
CONVERT = """
import runpy, sys
converter_dir, argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, converter_dir)
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"  # see llama_cpp_baseline.py
sys.argv = ["convert_hf_to_gguf.py", *argv]
runpy.run_path(converter_dir + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def llama_cpp_skip_reason() -> str | None:
    """Why llama.cpp is not run, or None when it can be."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama_cpp is not importable (llama-cpp-python is the optional extra `llama`: "
                "pip install -e '.[llama]', which builds llama.cpp from source)")
    return None


def installed_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def find_converter(source: str | None = None) -> tuple[Path, str]:
    """(folder holding convert_hf_to_gguf.py, where it came from)."""
    source = source or os.environ.get("LLAMA_CPP_SOURCE")
    if source:
        folder = Path(source)
        if not (folder / "convert_hf_to_gguf.py").exists():
            raise FileNotFoundError(f"{folder} has no convert_hf_to_gguf.py (give a llama.cpp checkout)")
        return folder, f"{folder} (given)"
    version = installed_version()
    unpacked = CACHE / f"llama_cpp_python-{version}"
    folder = unpacked / "vendor" / "llama.cpp"
    where = f"the llama-cpp-python {version} sdist (pip download), vendor/llama.cpp, unpacked in {unpacked}"
    if not (folder / "convert_hf_to_gguf.py").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "--dest", str(CACHE), f"llama-cpp-python=={version}"], check=True)
        with tarfile.open(CACHE / f"llama_cpp_python-{version}.tar.gz") as tar:
            tar.extractall(CACHE, filter="data")
    return folder, where


def build_ggufs(folder: Path, out_dir: Path, converter_dir: Path, threads: int) -> dict[str, Path]:
    """{"bf16": path, "q8_0": path, "q4_0": path}, each built by llama.cpp's own tools."""
    import llama_cpp

    paths = {"bf16": out_dir / "model-bf16.gguf"}
    done = subprocess.run([sys.executable, "-c", CONVERT, str(converter_dir), str(folder),
                           "--outfile", str(paths["bf16"]), "--outtype", "bf16"], capture_output=True, text=True)
    if done.returncode != 0:  # its log is long: show the end, where the error is
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    for name, ftype in QUANT_TYPES.items():
        paths[name] = out_dir / f"model-{name}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, ftype)
        params.nthread = threads
        status = llama_cpp.llama_model_quantize(str(paths["bf16"]).encode(), str(paths[name]).encode(),
                                                ctypes.byref(params))
        if status != 0:
            raise RuntimeError(f"llama_model_quantize to {name} returned {status}")
    return paths


def llama_cpp_step_ms(path: Path, threads: int, num_tokens: int, prompt: list[int]):
    """Load one GGUF in a worker process and return `step_ms(batch_size)`: greedy decode of
    `num_tokens` after `prompt` (token ids), the mean gap between tokens from the first new token
    on.  Batch 1 only (llama-cpp-python's `Llama` decodes one sequence).

    Why a worker process: llama.cpp crashed (a segmentation fault in its first decode) in some
    set-ups here, measured with llama-cpp-python 0.3.36 built with GGML_NATIVE on an AVX-512 +
    AMX Xeon: Q8_0 with llama.cpp's extra buffer types (the weight repacking for AMX / AVX-512)
    on, and bf16 in the benchmark's own process.  A worker that dies takes only itself down; one
    that dies with the extra buffer types on is restarted without them (`use_extra_bufts=False`),
    and the script says so (`step_ms.note`)."""
    def start(extra_bufts: bool):
        return subprocess.Popen([sys.executable, __file__, str(path), str(threads), ",".join(map(str, prompt)),
                                 str(int(extra_bufts))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(worker, n: int) -> float | None:
        worker.stdin.write(f"{n}\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        return float(line) if line else None

    worker = start(True)
    note = None
    if ask(worker, 3) is None:  # the warm-up
        note = f"llama.cpp crashed on {path.name} ({worker.wait()}); rerun with use_extra_bufts=False (no repacking)"
        print(f"   {note}", flush=True)
        worker = start(False)
        if ask(worker, 3) is None:
            raise RuntimeError(f"the llama.cpp worker for {path.name} exited ({worker.wait()}) without extra buffers too")

    def step_ms(batch_size: int, n: int = num_tokens) -> float:
        if batch_size != 1:
            raise ValueError("llama-cpp-python's Llama decodes one sequence at a time")
        ms = ask(worker, n)
        if ms is None:
            raise RuntimeError(f"the llama.cpp worker for {path.name} exited ({worker.wait()})")
        return ms

    step_ms.note = note
    return step_ms


def serve(path: Path, threads: int, prompt: list[int], extra_bufts: bool) -> None:
    """The worker: for each line n on stdin, decode n greedy tokens and print the step ms."""
    import llama_cpp
    from llama_cpp import llama as llama_module

    if not extra_bufts:  # `Llama` does not expose it: default parameters without them
        defaults = llama_cpp.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_module.llama_cpp.llama_model_default_params = without_extra_bufts
    llm = llama_module.Llama(str(path), n_ctx=max(512, len(prompt) + 1024), n_threads=threads,
                             n_threads_batch=threads, verbose=False)
    for line in sys.stdin:
        n, times = int(line), []
        # top_k=1, temp=0: greedy.  generate() yields each token as it is sampled, the first
        # after the prefill; it reuses the list it is given as its buffer, hence the copy.
        for _ in llm.generate(list(prompt), top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == n:
                break
        print((times[-1] - times[0]) / (len(times) - 1) * 1e3, flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")], sys.argv[4] == "1")
