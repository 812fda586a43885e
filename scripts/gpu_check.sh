#!/usr/bin/env bash
# One pass over a fresh GPU machine: install, run the tests on CUDA (kernels, CUDA graphs, engine),
# measure the decode kernel's bandwidth, batch-1 decode readable vs fused, run the throughput
# benchmark, print a short table.
# Meant for a machine with torch, triton and transformers already installed and no internet;
# finishes within about 7.5 minutes (each stage runs under `timeout`).
#
#     bash scripts/gpu_check.sh              # on a CUDA machine, from the repository root
#     bash scripts/gpu_check.sh --dry-run    # anywhere: a rehearsal: a few CPU tests (Triton interpreter)
#                                            # and the benchmark's --quick sizes, ~1-2 minutes
#
# Logs, the benchmark's JSON and the summary go to $OUT (or a fresh temporary folder).
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S (total seconds, default 450),
# GPU_CHECK_TESTS_S (test stage limit, default 210), GPU_CHECK_BENCH_ARGS (extra benchmark flags).
set -uo pipefail

DRY_RUN=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (use --dry-run or nothing)"; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
OUT_DIR=${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$OUT_DIR"
BUDGET_S=${GPU_CHECK_BUDGET_S:-450}
TESTS_S=${GPU_CHECK_TESTS_S:-210}
SECONDS=0
echo "== gpu_check: repository $ROOT, outputs in $OUT_DIR, budget ${BUDGET_S}s"

# -- 0. the machine ------------------------------------------------------------------------------
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "torch does not import with $PYTHON"; exit 2
fi
HAS_CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))")
if [[ $DRY_RUN == 0 && $HAS_CUDA != 1 ]]; then
    echo "no CUDA device visible to torch; run with --dry-run for the CPU rehearsal"; exit 2
fi
if [[ $DRY_RUN == 1 && $HAS_CUDA != 1 ]]; then
    export TRITON_INTERPRET=1  # the kernels run in Triton's interpreter on the CPU
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# -- 1. install (no network: no build isolation, no dependencies); PYTHONPATH as a fallback ------
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [[ $DRY_RUN == 1 ]]; then
    echo "dry run: not installing (PYTHONPATH=$ROOT)"
elif timeout 60 "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT_DIR/pip.log" 2>&1; then
    echo "installed minilm-engine (editable)"
else
    echo "pip install -e . failed (see $OUT_DIR/pip.log); using PYTHONPATH=$ROOT"
fi
"$PYTHON" -c "import minilm_engine" || { echo "minilm_engine does not import"; exit 2; }

# -- 2. tests ------------------------------------------------------------------------------------
TESTS_SUMMARY="not run"
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
    TESTS_SUMMARY="skipped: pytest is not installed"
else
    if [[ $DRY_RUN == 1 ]]; then
        # A rehearsal of this stage, not a test run: the suite runs these tests on the CPU
        # already, so the dry run takes the fastest few (the interpreter is slow).
        TEST_PATHS=(tests/test_triton_kernels.py)
        TEST_FILTER=(-k "write_kv")
        MARKERS="not notebook and not scripts and not slow"  # the interpreter is slow
    else
        TEST_PATHS=(tests)
        TEST_FILTER=()
        MARKERS="not notebook and not scripts"
    fi
    # Test files whose imports this machine lacks (hypothesis, plotly, ...) would stop the run at
    # collection: find them first and leave them out, by name.
    IGNORES=()
    BROKEN=$(timeout 60 "$PYTHON" -m pytest "${TEST_PATHS[@]}" -m "$MARKERS" --collect-only -q \
                 -p no:cacheprovider 2>&1 | sed -n 's/^ERROR \(tests\/[^ :]*\.py\).*/\1/p' | sort -u)
    for f in $BROKEN; do IGNORES+=(--ignore="$f"); done
    [[ -n $BROKEN ]] && echo "left out (imports missing here): $(echo $BROKEN | tr '\n' ' ')"
    echo "== tests (limit ${TESTS_S}s)"
    # On a GPU every failure is worth seeing in one pass (a lent machine is rare): no -x, and the
    # tests spread over the CPU's cores when pytest-xdist is there (the CUDA tests share the card).
    RUN_OPTS=(-x)
    if [[ $DRY_RUN == 0 ]]; then
        RUN_OPTS=(--maxfail=150 -rfE --durations=10)
        "$PYTHON" -c "import xdist" 2>/dev/null && RUN_OPTS+=(-n "${GPU_CHECK_WORKERS:-8}")
    fi
    # SIGINT at the limit: pytest stops as on Ctrl-C and still prints what failed.
    timeout -s INT -k 30 "$TESTS_S" "$PYTHON" -m pytest "${TEST_PATHS[@]}" -m "$MARKERS" -q "${RUN_OPTS[@]}" -p no:cacheprovider \
        "${TEST_FILTER[@]}" "${IGNORES[@]}" >"$OUT_DIR/pytest.log" 2>&1
    TESTS_RC=$?
    grep -E "^(FAILED|ERROR) " "$OUT_DIR/pytest.log" | head -n 40
    tail -n 5 "$OUT_DIR/pytest.log"
    LAST=$(grep -E '[0-9]+ (passed|failed|error)' "$OUT_DIR/pytest.log" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
    if [[ $TESTS_RC == 124 || $TESTS_RC == 137 ]]; then
        TESTS_SUMMARY="stopped at the ${TESTS_S}s limit (${LAST:-no summary})"
    else
        TESTS_SUMMARY="${LAST:-no summary} (exit $TESTS_RC)"
    fi
    [[ -n $BROKEN ]] && TESTS_SUMMARY="$TESTS_SUMMARY; left out: $(echo $BROKEN | tr '\n' ' ')"
fi
echo "tests: $TESTS_SUMMARY  [${SECONDS}s elapsed]"

# -- 3a. the decode kernel's bandwidth (appendix A1's experiment 3), GPU only -------------------
if [[ $HAS_CUDA == 1 ]]; then
    echo "== decode kernel bandwidth (Qwen3-0.6B attention shape, bf16, 32 and 256 sequences)"
    timeout -k 10 90 "$PYTHON" - "$OUT_DIR/kernel_bandwidth.json" <<'KERNEL' 2>&1 | tee "$OUT_DIR/kernel_bandwidth.log"
import json, sys
import torch
from minilm_engine.course.experiments.kernel_stats import measure_decode_bandwidth
from minilm_engine.course.experiments.batching import measure_copy_bandwidth

copy = measure_copy_bandwidth(num_bytes=1 << 30, device="cuda")
points = (measure_decode_bandwidth([256, 1024, 4096, 16384], 32, 16, 8, 128, torch.bfloat16, "cuda")
          + measure_decode_bandwidth([1024], 256, 16, 8, 128, torch.bfloat16, "cuda"))
rows = [dict(num_seqs=p.num_seqs, context_len=p.context_len, microseconds=1e6 * p.seconds,
             GBps=p.bytes_per_s / 1e9, of_copy=p.bytes_per_s / copy) for p in points]
for r in rows:
    print(f"{r['num_seqs']:4d} seqs x {r['context_len']:6d} tokens: {r['microseconds']:8.1f} us, "
          f"{r['GBps']:6.0f} GB/s = {r['of_copy']:.0%} of the copy bandwidth ({copy / 1e9:.0f} GB/s)")
json.dump({"copy_GBps": copy / 1e9, "points": rows}, open(sys.argv[1], "w"), indent=2)
KERNEL
fi

# -- 3a'. batch-1 decode, readable vs fused (benchmarks/fused_step.py), GPU only -----------------
if [[ $HAS_CUDA == 1 ]]; then
    echo "== benchmarks/fused_step.py (the Triton-fused layers against the readable ones, batch 1)"
    timeout -k 10 100 "$PYTHON" benchmarks/fused_step.py --json "$OUT_DIR/fused_step.json" 2>&1 \
        | grep -v -e "Writing model shards" -e "profiler_st" | tee "$OUT_DIR/fused_step.log"
fi

# -- 3b. the throughput benchmark, in what is left of the budget ---------------------------------
LEFT=$((BUDGET_S - SECONDS - 15))
(( LEFT < 60 )) && LEFT=60
BENCH_ARGS=(--json "$OUT_DIR/throughput.json")
[[ $DRY_RUN == 1 ]] && BENCH_ARGS+=(--quick --device cpu)
# shellcheck disable=SC2206
BENCH_ARGS+=(${GPU_CHECK_BENCH_ARGS:-})
echo "== benchmarks/throughput.py ${BENCH_ARGS[*]} (limit ${LEFT}s)"
timeout -k 10 "$LEFT" "$PYTHON" benchmarks/throughput.py "${BENCH_ARGS[@]}" 2>&1 \
    | grep -v -e "Writing model shards" | tee "$OUT_DIR/throughput.log"
BENCH_RC=${PIPESTATUS[0]}
[[ $BENCH_RC == 124 || $BENCH_RC == 137 ]] && echo "(benchmark stopped at the ${LEFT}s limit; the table shows what it finished)"

# -- 3c. speculative decoding (benchmarks/spec_decode.py), in what is left ------------------------
LEFT=$((BUDGET_S - SECONDS - 10))
if (( LEFT >= 30 )); then
    SPEC_ARGS=(--json "$OUT_DIR/spec_decode.json")
    [[ $DRY_RUN == 1 ]] && SPEC_ARGS+=(--quick --device cpu)
    echo "== benchmarks/spec_decode.py ${SPEC_ARGS[*]} (limit ${LEFT}s)"
    timeout -k 10 "$LEFT" "$PYTHON" benchmarks/spec_decode.py "${SPEC_ARGS[@]}" 2>&1 | tee "$OUT_DIR/spec_decode.log"
else
    echo "== benchmarks/spec_decode.py skipped: ${LEFT}s left"
fi

# -- 3d. weight-only quantization (benchmarks/quantization.py), GPU only, in what is left -------
LEFT=$((BUDGET_S - SECONDS - 10))
if [[ $HAS_CUDA == 1 ]] && (( LEFT >= 60 )); then
    echo "== benchmarks/quantization.py --skip-cpu-speed (limit ${LEFT}s)"
    timeout -k 10 "$LEFT" "$PYTHON" benchmarks/quantization.py --skip-cpu-speed --threads 8 \
        --json "$OUT_DIR/quantization.json" 2>&1 | grep -v -e "Writing model shards" | tee "$OUT_DIR/quantization.log"
elif [[ $HAS_CUDA == 1 ]]; then
    echo "== benchmarks/quantization.py skipped: ${LEFT}s left"
fi

# -- 4. the summary ------------------------------------------------------------------------------
TESTS_SUMMARY="$TESTS_SUMMARY" BENCH_RC="$BENCH_RC" ELAPSED="$SECONDS" "$PYTHON" - "$OUT_DIR/throughput.json" "$OUT_DIR/kernel_bandwidth.json" "$OUT_DIR/quantization.json" \
    <<'EOF' | tee "$OUT_DIR/summary.txt"
import json, os, sys
from pathlib import Path

import torch

try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "not installed"
import transformers

path = Path(sys.argv[1])
data = json.loads(path.read_text()) if path.is_file() else {}
card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (dry run on the CPU)"
rows = [
    ("card", card),
    ("torch / triton / transformers", f"{torch.__version__} / {triton_version} / {transformers.__version__}"),
    ("tests", os.environ["TESTS_SUMMARY"]),
    ("model", data.get("model", "-")),
    ("minilm-engine", data.get("minilm-engine", "-")),
]
results = data.get("results", [])
ours = {r["workload"]: r for r in results if r["system"].startswith("minilm")}
for r in results:
    ref = ours.get(r["workload"])
    ratio = "" if ref is None or ref is r or not r["tokens_per_s"] else f"  (minilm-engine {ref['tokens_per_s'] / r['tokens_per_s']:.2f}x)"
    rows.append((f"{r['system']}, {r['workload']}", f"{r['tokens_per_s']:,.0f} output tok/s{ratio} {r['note']}".strip()))
if "ceiling_tokens_per_s" in data:
    ceiling = data["ceiling_tokens_per_s"]
    rows.append(("batch-1 ceiling", f"{ceiling:,.0f} tok/s = {data['copy_bandwidth_GBps']:.0f} GB/s copy / "
                                    f"{data['weight_GB']:.3g} GB weights"))
    for key, who in (("minilm_batch1_tokens_per_s", "minilm-engine"),
                     ("minilm_eager_batch1_tokens_per_s", "minilm-engine, eager"),
                     ("hf_batch1_tokens_per_s", "transformers")):
        if key in data:
            rows.append((f"batch-1 decode, {who}", f"{data[key]:,.0f} tok/s = {data[key] / ceiling:.1%} of the ceiling"))
kernel = Path(sys.argv[2])
if kernel.is_file():
    k = json.loads(kernel.read_text())
    for p in k["points"]:
        rows.append((f"decode kernel, {p['num_seqs']} seqs x {p['context_len']} tokens",
                     f"{p['GBps']:,.0f} GB/s = {p['of_copy']:.0%} of copy ({k['copy_GBps']:,.0f} GB/s)"))
fused = Path(sys.argv[1]).with_name("fused_step.json")
if fused.is_file():
    f = json.loads(fused.read_text())
    per = {b: f[f"{b}_per_step"] for b in ("reference", "fused")}
    rows.append(("batch 1, fused vs readable", f"{f['speedup_median']:.2f}x [{f['speedup_range'][0]:.2f}-"
                 f"{f['speedup_range'][1]:.2f}], kernels a step {per['reference']['kernels']:.0f} -> "
                 f"{per['fused']['kernels']:.0f} (same tokens: {f['same_tokens']})"))
spec = Path(sys.argv[1]).with_name("spec_decode.json")
if spec.is_file():
    sd = json.loads(spec.read_text())
    rows.append(("speculative decoding, batch 1", f"{sd['best_speedup']:.2f}x at K = {sd['best_k']} "
                                                  f"(same tokens: {sd['all_same_tokens']})"))
    for r in sd["batches"]:
        if r["K"]:
            rows.append((f"speculative decoding, batch {r['batch_size']}", f"{r['speedup']:.2f}x at K = {r['K']}"))
quant = Path(sys.argv[3])
if quant.is_file():
    q = json.loads(quant.read_text())
    for label, by_batch in q.get("gpu_tokens_per_s", {}).items():
        base = q["gpu_tokens_per_s"]["bf16"]
        rows.append((f"quantization, {label}", "  ".join(
            f"batch {b}: {v:,.0f} tok/s ({v / base[b]:.2f}x bf16)" for b, v in by_batch.items())))
for label, error in data.get("errors", {}).items():
    rows.append((f"FAILED: {label}", error[:200]))
if not data:
    rows.append(("benchmark", f"no results (exit {os.environ['BENCH_RC']})"))
rows.append(("elapsed", f"{os.environ['ELAPSED']} s"))
width = max(len(k) for k, _ in rows)
print("=" * 100)
for k, v in rows:
    print(f"{k:<{width}}  {v}")
print("=" * 100)
EOF
# Non-zero when the tests or the benchmark failed, so a caller need not read the table to know.
[[ ${TESTS_RC:-0} == 0 && $BENCH_RC == 0 ]] || exit 1
