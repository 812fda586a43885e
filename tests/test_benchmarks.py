"""The benchmark scripts and the GPU check run end to end, at their smallest sizes.

They are what a GPU session runs in its few minutes of device time, so a script that a change
elsewhere broke must fail here, on the CPU, first.  What is checked is that they run and report
every measurement they promise; the numbers themselves are not (timings in tests are noise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilm_engine.model.device import native_bf16_matmul

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.scripts]


def run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_gpu_check_dry_run_runs_the_tests_and_the_throughput_and_spec_decode_benchmarks(tmp_path):
    """The dry run of scripts/gpu_check.sh, and in it benchmarks/spec_decode.py --quick on the CPU:
    what this file checked of that script's own --quick run it checks here, on the dry run's
    output (one run of it, not two)."""
    done = run(["bash", "scripts/gpu_check.sh", "--dry-run"], ROOT, {"PYTHON": sys.executable, "OUT": str(tmp_path)})
    summary = (tmp_path / "summary.txt").read_text()
    assert "no GPU (dry run on the CPU)" in summary and "(exit 0)" in summary, done.stdout[-3000:]
    assert "speculative decoding, batch 1" in summary and "(same tokens: True)" in summary
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data["errors"] == {}
    runs = {(r["system"], r["workload"].split()[0]): r for r in data["results"]}
    assert set(runs) == {("minilm-engine", "A"), ("minilm-engine", "B"),
                         ("transformers.generate (static, batch 4)", "B"),
                         ("transformers generate_batch (continuous)", "B")}
    # A run that produced fewer tokens than asked says so in its note.
    assert not any("produced" in r["note"] for r in runs.values())
    assert data["minilm_batch1_tokens_per_s"] > 0 and data["ceiling_tokens_per_s"] > 0
    # batch 1 alternates the two systems; the ratio printed is the median of the pairs'
    assert len(data["minilm_batch1_runs"]) == len(data["hf_batch1_runs"]) == len(data["batch1_pair_ratios"]) == 3
    assert "no CUDA graphs (eager)" in data["minilm-engine"]
    # benchmarks/spec_decode.py --quick --device cpu, as the check ran it: its three parts, and
    # the speedups and the formula in its JSON
    out = (tmp_path / "spec_decode.log").read_text()
    for number in ("1.", "2.", "3."):
        assert f"\n{number} " in out, out
    spec = json.loads((tmp_path / "spec_decode.json").read_text())
    assert spec["all_same_tokens"]
    assert [(r["batch_size"], r["K"]) for r in spec["batch1"]] == [(1, 0), (1, 1), (1, 4)]
    assert [(r["batch_size"], r["K"]) for r in spec["batches"]] == [(4, 0), (4, spec["best_k"])]
    assert all(r["measured_tokens_per_round"] > 1 and r["formula_tokens_per_round"] > 1 for r in spec["tokens_per_forward"])


def test_serving_benchmark_prints_its_five_ratios():
    out = run([sys.executable, "serving.py", "--quick"], ROOT / "benchmarks").stdout
    for number in ("1.", "2.", "3.", "4.", "5."):
        assert f"\n{number} " in out, out


def test_kv_cache_benchmark_runs():
    out = run([sys.executable, "kv_cache.py", "--lengths", "8", "16", "--repeats", "1"], ROOT / "benchmarks").stdout
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("8", "16")]
    assert [row[0] for row in rows] == ["8", "16"] and all(row[3].endswith("x") for row in rows), out


def test_quantization_benchmark_prints_bytes_and_speed_ratios(tmp_path):
    # One thread and two repeats, as the other scripts here: CI runs this beside a notebook, where a
    # second OpenMP thread only waits on a busy core.
    out = run([sys.executable, "quantization.py", "--quick", "--tokens", "4", "--threads", "1", "--repeats", "2",
               "--json", str(tmp_path / "q.json")], ROOT / "benchmarks").stdout
    assert "1. bytes" in out and "2. batch-1 decode on the CPU" in out and "3. decode step (ms)" in out, out
    for label in ("int8", "int4 g128"):
        # bytes, fp32 and bf16 speed, the batch table's two rows; with the LM head quantized too: bytes
        # and bf16 speed
        assert sum(line.strip().startswith(label) for line in out.splitlines()) == 7, out
        assert sum(line.strip().startswith(f"{label} + head") for line in out.splitlines()) == 2, out
    assert "int8, bf16 (cpu kernel)" in out and "int4 g128, fp32 (cpu kernel)" in out, out
    assert "int8 + head, bf16 (cpu kernel)" in out and "read per decode step" in out, out
    # part 3: every setting has a median, a spread and a ratio per batch size and for the prefill
    table = json.loads((tmp_path / "q.json").read_text())["cpu_batch_table"]
    assert set(table) == {"bf16", "fp32", "int8", "int4 g128", "int8, fp32", "int4 g128, fp32"}
    for cells in table.values():
        assert list(cells) == ["decode batch 1", "decode batch 4", "decode batch 16", "prefill 64 tok"]
        assert all(c["min_ms"] <= c["median_ms"] <= c["max_ms"] and c["speedup_vs_bf16"] > 0
                   and c["speedup_vs_fp32"] > 0 for c in cells.values())
    assert all(c["speedup_vs_bf16"] == 1.0 for c in table["bf16"].values())
    assert all(c["speedup_vs_fp32"] == 1.0 for c in table["fp32"].values())


def test_step_cost_benchmark_times_the_shipped_chef(tmp_path):
    out = run([sys.executable, "step_cost.py", "--model", "noodle-chef", "--quick", "--json", str(tmp_path / "s.json")],
              ROOT / "benchmarks").stdout
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["model"] == "noodle-chef" and list(data["sizes"]) == ["1", "4"] and "noodle-chef" in out, out
    assert all(s["min_ms"] <= s["median_ms"] <= s["max_ms"] and 0 < s["prepare_ms"] < s["median_ms"]
               and s["per_request_us"] > 0 for s in data["sizes"].values())


def test_cpu_decode_benchmark_reports_every_system_against_transformers_and_the_floor(tmp_path):
    out = run([sys.executable, "cpu_decode.py", "--quick", "--tokens", "4", "--repeats", "2", "--threads", "1",
               "--json", str(tmp_path / "c.json")], ROOT / "benchmarks").stdout
    assert "weight-read floor" in out and "1. batch-1 decode" in out and "2. decode at batch 4 and 16" in out, out
    data = json.loads((tmp_path / "c.json").read_text())
    engines = [f"minilm-engine {backend}, {dtype}" for dtype in ("bf16", "fp32") for backend in ("reference", "fused")]
    hf = ["transformers.generate, bf16", "transformers.generate, fp32"]
    quantized = ["minilm-engine int8, bf16", "minilm-engine int4, bf16"]
    llama = [] if "skipped" in data["llama_cpp"] else ["llama.cpp bf16", "llama.cpp q8_0", "llama.cpp q4_0"]
    assert list(data["batch1"]) == engines + quantized + hf + llama
    # the fused backend really ran (it did not fall back) wherever it can: bf16 only on a CPU whose
    # oneDNN has bf16; quantized models run it too (their projections keep their own kernels)
    chefs = ["noodle-chef reference, fp32", "noodle-chef fused, fp32"]
    def backend(label: str) -> str:
        fused_runs = "fp32" in label or native_bf16_matmul()
        return label.split()[1].rstrip(",") if fused_runs else "reference"

    assert data["model_backends"] == {**{label: backend(label) for label in engines},
                                      **{label: "fused" for label in quantized},
                                      **{label: label.split()[1].rstrip(",") for label in chefs}}
    # part 4: the shipped chef against its own floor (issue 22: within 2x)
    assert "4. the shipped noodle-chef" in out and list(data["chef"]) == chefs
    for row in data["chef"].values():
        assert row["step_over_floor"]["median"] > 0 and len(row["runs_ms"]) == 2
        assert row["bytes_per_step"] > 0 and row["floor_ms"]["median"] > 0
    assert data["floor"]["fp32"]["bytes_per_step"] == 2 * data["floor"]["bf16"]["bytes_per_step"]
    for row in data["batch1"].values():
        s = row["step_ms"]
        assert s["min"] <= s["median"] <= s["max"] and len(row["runs_ms"]) == 2
        assert row["vs_transformers"] > 0 and row["vs_reference"] > 0 and row["of_floor"] > 0
    assert all(data["batch1"][label]["vs_transformers"] == 1.0 for label in hf)
    bf16 = [label for label in engines + hf if label.endswith("bf16")]  # batch 4 / 16: no quantized, no llama.cpp
    assert list(data["batches"]) == bf16 and all(list(cells) == ["4", "16"] for cells in data["batches"].values())
    if llama:  # built with llama.cpp's own converter and quantizer, paired with the engine per precision
        assert "convert_hf_to_gguf.py" in out and data["llama_cpp"]["converter"]
        sizes = data["llama_cpp"]["gguf_bytes"]
        assert sizes["bf16"] > sizes["q8_0"] > sizes["q4_0"]
        table = data["llama_cpp"]["table"]
        assert list(table) == ["bf16", "q8_0", "q4_0"] and all(row["ratio"] > 0 for row in table.values())
    else:  # llama.cpp is an optional extra: without it the script says it skipped it and why
        assert "llama.cpp: skipped: " in out and data["llama_cpp"]["skipped"]


def test_cpu_step_profile_splits_a_decode_step_into_its_parts(tmp_path):
    run([sys.executable, "cpu_step_profile.py", "--quick", "--steps", "2", "--repeats", "1", "--threads", "1",
         "--json", str(tmp_path / "p.json")], ROOT / "benchmarks")
    data = json.loads((tmp_path / "p.json").read_text())
    # bf16 (its default) is fused where this CPU's oneDNN has bf16, else the readable model runs
    assert data["backend"] == ("fused" if native_bf16_matmul() else "reference")
    (split,) = data["runs_ms"]
    # every leaf was reached by its wrapper, and no range counted twice (nested ranges would
    # add up to more than the step's wall time, leaving "other" negative)
    assert all(split[part] > 0 for part in ("matmul", "attention", "norms", "rotary", "sampling"))
    assert 0 < split["other"] < split["step_ms"]


def test_fused_step_benchmark_compares_both_decoders_and_counts_their_ops(tmp_path):
    done = run([sys.executable, "fused_step.py", "--quick", "--device", "cpu", "--tokens", "8", "--repeats", "2",
                "--threads", "1", "--json", str(tmp_path / "f.json")], ROOT / "benchmarks")
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["same_tokens"] and "greedy tokens equal" in done.stdout
    assert all(len(data["ms_per_step"][b]) == 2 for b in ("reference", "fused"))
    # fewer ops a step is the fused path's point: q/k/v and gate/up one matmul, one call per norm
    assert data["fused_per_step"]["torch ops"] < data["reference_per_step"]["torch ops"]


def test_tiers_benchmark_prints_its_three_parts(tmp_path):
    out = run([sys.executable, "tiers.py", "--quick", "--json", str(tmp_path / "tiers.json")], ROOT / "benchmarks").stdout
    for part in ("\n1. ", "\n2. ", "\n3. "):
        assert part in out, out
    data = json.loads((tmp_path / "tiers.json").read_text())
    assert set(data["conditions"]) == {"fcfs", "fcfs+backlog", "priority", "priority+backlog"}
    assert 0 <= data["batch_discount"] < 1


def test_disaggregation_benchmark_prints_every_cell_and_the_same_tokens(tmp_path):
    out = run([sys.executable, "disaggregation.py", "--quick", "--json", str(tmp_path / "d.json")],
              ROOT / "benchmarks").stdout
    for label in ("decode ITL P50 (ms)", "decode ITL P99 (ms)", "TTFT, long prompts (ms)", "KV sent (MiB)"):
        line = next(line for line in out.splitlines() if line.startswith(label))
        assert line.count("[") == 3, out  # one median [min-max] per configuration
    assert "same tokens in every configuration and repeat: True" in out, out
    data = json.loads((tmp_path / "d.json").read_text())
    assert [r["config"] for r in data["summary"]] == ["mixed", "chunked", "disagg"]
    assert len(data["runs"]) == 6 and data["same_tokens"]
    disagg = data["summary"][2]
    assert disagg["kv_tokens"] + disagg["kv_cached_tokens"] > 0 and data["summary"][0]["kv_mib"] == 0


def test_quantization_kernels_benchmark_names_both_thresholds():
    out = run([sys.executable, "quantization_kernels.py", "--rows", "1,20", "--repeats", "1", "--calls", "1"],
              ROOT / "benchmarks").stdout
    assert [line.split()[0] for line in out.splitlines() if line.split()[:1] in (["1"], ["20"])] == ["1", "20"], out
    assert "int8: dequantize+matmul beats the operator from" in out and "int4: dequantize" in out, out


def test_sampler_cost_benchmark_compares_both_samplers():
    out = run([sys.executable, "sampler_cost.py", "--rows", "8", "--vocab", "500", "--repeats", "2"],
              ROOT / "benchmarks").stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["8"]]
    assert len(rows) == 5 and all(row[-1].endswith("x") for row in rows), out


def test_roofline_benchmark_prints_measured_and_predicted_steps(tmp_path):
    out = run([sys.executable, "roofline.py", "--quick", "--threads", "1", "--batch-sizes", "1,2", "--steps", "2",
               "--json", str(tmp_path / "r.json")], ROOT / "benchmarks").stdout
    assert "read bandwidth" in out and "ridge B*" in out, out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["read_bandwidth"] > 0 and data["matmul_flops"] > 0
    assert [(r["precision"], r["batch_size"]) for r in data["rows"]] == [
        ("fp32", 1), ("fp32", 2), ("bf16", 1), ("bf16", 2)]
    assert all(r["predicted_s"] > 0 and r["kernel_s"] and r["torch_s"] for r in data["rows"])
    assert set(data["ridge"]) == {"fp32", "bf16"}
    assert "scoring 5 tokens / one decode step" in out and "goals (medians of this run)" in out, out
    assert set(data["verify_over_step"]) == {"fp32", "bf16"}
    assert all(ratios and min(ratios) > 0 for ratios in data["verify_over_step"].values())
    # Each B's step split into its matmuls and the rest, measured in pairs.
    assert {p: sorted(by_b) for p, by_b in data["step_split"].items()} == {"fp32": ["1", "2"], "bf16": ["1", "2"]}
    parts = [p for by_b in data["step_split"].values() for p in by_b.values()]
    assert all(0 < p["matmul_s"] < p["step_s"] and p["rest_s"] > 0 for p in parts), parts
    assert out.count("the step split (with the micro-kernel): B=1") == 2 and "+ the rest" in out, out


def test_structured_outputs_benchmark_prints_the_overhead_and_the_mask(tmp_path):
    out = run([sys.executable, "structured_outputs.py", "--quick", "--threads", "1"], ROOT / "benchmarks").stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    assert len(rows) == 4 and rows[0][-1].endswith("%") and "the mask alone" in out, out


def test_attention_benchmark_times_both_backends_on_prefill_and_decode(tmp_path):
    out = run([sys.executable, "attention.py", "--quick", "--threads", "1", "--json", str(tmp_path / "a.json")],
              ROOT / "benchmarks").stdout
    data = json.loads((tmp_path / "a.json").read_text())
    assert [r["step"] for r in data["rows"]] == ["prefill T=64", "decode B=8 C=64"], out
    assert all(len(r["torch_s"]) == len(r["cpu_s"]) == 1 for r in data["rows"])
