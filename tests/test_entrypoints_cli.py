"""`minilm-engine serve` as a user runs it: a real process that serves, then stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from minilm_engine.entrypoints.cli.main import main
from minilm_engine.course.experiments.server_thread import free_port


@pytest.mark.parametrize("extra, message", [(["--port", "0"], "--port"), (["--max-num-seqs", "0"], "max_num_seqs"),
                                            (["--threads", "0"], "--threads")])
def test_bad_arguments_exit_2_with_the_reason(capsys, extra, message):
    assert main(["serve", "noodle-apprentice", "--device", "cpu", *extra]) == 2
    assert message in capsys.readouterr().err


def test_speculative_config_must_be_a_json_object(capsys):
    for bad in ("{nope", "[1]"):
        with pytest.raises(SystemExit) as e:
            main(["serve", "--speculative-config", bad])
        assert e.value.code == 2
        assert "--speculative-config" in capsys.readouterr().err


def test_serve_process_answers_then_stops_on_ctrl_c():
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "minilm_engine", "serve", "noodle-apprentice", "--port", str(port),
               "--device", "cpu", "--max-num-seqs", "4", "--log-level", "warning", "--shutdown-timeout", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1][-2000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        reply = httpx.post(url + "/v1/completions", json={"model": "noodle-apprentice", "prompt": "Receipt #1\n",
                                                          "max_tokens": 5, "temperature": 0}, timeout=30)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 5
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err[-2000:]
        assert "serving on http://127.0.0.1:" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.parametrize("extra, backend", [([], "fused"), (["--model-backend", "reference"], "reference")])
def test_model_backend_flag_reaches_the_engine(monkeypatch, extra, backend):
    import argparse

    from minilm_engine.entrypoints.cli.serve import add_engine_arguments, llm_from_args

    monkeypatch.delenv("MINILM_MODEL_BACKEND", raising=False)
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_engine_arguments(parser)
    args = parser.parse_args(["noodle-apprentice", "--device", "cpu", "--kv-cache-memory", str(8 << 20), *extra])
    assert llm_from_args(args).model_backend == backend
