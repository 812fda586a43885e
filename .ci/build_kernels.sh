#!/usr/bin/env bash
# CI set-up: build the engine's two C++ CPU kernels (the micro-kernel and the paged decode
# attention, model/cpu_build.py) for one venv, so that no test stage waits on a build.  .ci/run
# runs it in the background while other set-up still downloads.  It never fails: where a kernel
# cannot be built it says why, and the tests decide (MINILM_REQUIRE_MICROKERNEL=1 fails the
# micro-kernel's tests; without it they skip).
#
#     bash .ci/build_kernels.sh VENV_PYTHON      (the builds go to $TORCH_EXTENSIONS_DIR, or
#                                                 torch's default ~/.cache/torch_extensions)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD" "$1" - <<'PY' || echo "build_kernels: did not run (see above); the tests build the kernels on first use"
from minilm_engine.model.attention import cpu_compiled as attention
from minilm_engine.model.quantization.kernels import cpu_compiled as matmul

for what, kernel in (("CPU micro-kernel", matmul), ("CPU paged decode attention", attention)):
    print(f"build_kernels: {what}: {kernel.unavailable_reason() or 'built'}", flush=True)
PY
exit 0
