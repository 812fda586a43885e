"""Tests for minilm_engine.entrypoints.cli.main: `minilm-engine generate` streams the same text `LLM` generates."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.entrypoints.cli.main import main
from minilm_engine.model.device import cpu_threads_for

PROMPT = "Order for table 7:"


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_generate_streams_what_llm_generates(capsys):
    assert main(["generate", PROMPT, "--model", "noodle-apprentice", "--max-tokens", "12", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    llm = LLM("noodle-apprentice", device="cpu")
    (expected,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert out == PROMPT + expected.outputs[0].text  # the report goes to stderr
    assert "tokens/s" in err and f"finish_reason={expected.outputs[0].finish_reason}" in err
    assert "torch threads: 1" in err  # a small model on a CPU runs on one thread


def test_stop_string_and_threads(capsys):
    args = ["generate", PROMPT, "--model", "noodle-apprentice", "--max-tokens", "40", "--stop", "\n",
            "--threads", "2", "--device", "cpu"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "\n" not in out[len(PROMPT):]  # cut before the first newline it produced
    assert "finish_reason=stop" in err and "torch threads: 2" in err


@pytest.mark.parametrize(
    "extra, message",
    [(["--temperature", "-1"], "temperature"), (["--model", "/no/such/folder"], "/no/such/folder"),
     (["--threads", "0"], "--threads"), (["--device", "tpu"], "device")],
)
def test_bad_arguments_exit_2_with_the_reason(capsys, extra, message):
    assert main(["generate", PROMPT, "--model", "noodle-apprentice", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err


def test_threads_policy():
    assert cpu_threads_for(7_000_000) == 1
    assert cpu_threads_for(600_000_000) is None


def test_module_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "minilm_engine", "generate", "Hello", "--model", "noodle-apprentice",
         "--max-tokens", "4", "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Hello") and "4 tokens" in done.stderr


# ---------------------------------------------------------------------- speculative decoding
def test_speculative_decoding_prints_the_same_text_and_the_acceptance(capsys):
    args = ["generate", PROMPT, "--max-tokens", "30", "--device", "cpu"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--speculative-model", "noodle-apprentice", "--num-speculative-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == plain  # greedy: the chef's own text, token for token
    assert "LLM(model=" in err and "drafted tokens accepted" in err and "tokens per target forward" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-model", "noodle-apprentice"], "needs --num-speculative-tokens"),
        (["--num-speculative-tokens", "3"], "needs --speculative-model"),
        (["--speculative-model", "noodle-apprentice", "--num-speculative-tokens", "-1"], "num_speculative_tokens must be in"),
        (["--speculative-model", "/no/such/draft", "--num-speculative-tokens", "2"], "/no/such/draft"),
    ],
)
def test_bad_speculative_arguments_exit_2_with_the_reason(capsys, extra, message):
    assert main(["generate", PROMPT, "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
