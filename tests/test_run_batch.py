"""`minilm-engine run-batch` (entrypoints/openai/run_batch.py): OpenAI's batch format in, one
result line per request out, in input order; bad lines answered with the error `serve` would
give, every other line completed; the same answers as `serve` and `LLM.generate`; no block left.
"""

from __future__ import annotations

import json

import httpx
import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.entrypoints.cli.main import main
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.entrypoints.openai.run_batch import run_batch

MODEL = "noodle-apprentice"
PROMPTS = ["Order for table 7:\n", "Receipt #7061\n", "Kitchen ticket:"]


def completion(custom_id: str, prompt: str, **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


CHAT = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "Two, please."}],
                 "max_tokens": 10, "temperature": 0}}


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, device="cpu", record_trace=False)


def strip(body: dict) -> dict:
    """An answer without what differs from one call to the next (its id and time)."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def test_a_file_with_bad_lines_round_trips_in_order(llm):
    lines = [
        json.dumps(completion("a", PROMPTS[0])),
        "{not json",
        "",  # blank lines are skipped
        json.dumps(completion("b", PROMPTS[1], temperature="hot")),  # serve: a 400 naming temperature
        json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}),
        json.dumps(CHAT),
        json.dumps(completion("a", PROMPTS[2])),  # a repeated custom_id
        json.dumps(completion("d", PROMPTS[2], stream=True)),
        json.dumps(completion("e", PROMPTS[2], model="gpt-4")),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
        json.dumps(completion("f", PROMPTS[2])),
    ]
    results = run_batch(llm, lines, progress=False)
    assert [r["custom_id"] for r in results] == ["a", None, "b", "c", "chat", "a", "d", "e", None, "f"]
    status = [r["response"]["status_code"] for r in results]
    assert status == [200, 400, 400, 400, 200, 400, 400, 404, 400, 200]
    for r in results:
        assert r["id"].startswith("batch_req_")
        if r["response"]["status_code"] == 200:
            assert r["error"] is None and r["response"]["request_id"] == r["response"]["body"]["id"]
        else:
            body_error = r["response"]["body"]["error"]
            assert r["error"] == {"code": body_error["code"], "message": body_error["message"]}
    errors = {i: r["response"]["body"]["error"] for i, r in enumerate(results) if r["error"]}
    assert "not valid JSON" in errors[1]["message"] and "line 2" in errors[1]["message"]
    assert errors[2]["param"] == "temperature"
    assert errors[3]["param"] == "url" and "/v1/embeddings" in errors[3]["message"]
    assert "already used by line 1" in errors[5]["message"]
    assert errors[6]["param"] == "stream"
    assert errors[7]["code"] == "model_not_found"
    assert errors[8]["param"] == "custom_id"
    assert results[0]["response"]["body"]["object"] == "text_completion"
    assert results[4]["response"]["body"]["object"] == "chat.completion"
    engine = llm.engine
    assert not engine.has_unfinished_requests() and engine.block_pool.num_used_blocks == 0


def test_answers_equal_serve_and_generate(llm):
    lines = [json.dumps(completion(str(i), p, max_tokens=8 + 4 * i)) for i, p in enumerate(PROMPTS)]
    lines.append(json.dumps(CHAT))
    results = run_batch(llm, lines, progress=False)
    with ServerThread(llm) as server:
        served = [httpx.post(server.url + json.loads(line)["url"], json=json.loads(line)["body"], timeout=60).json()
                  for line in lines]
    assert [strip(r["response"]["body"]) for r in results] == [strip(s) for s in served]
    outputs = llm.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=8 + 4 * i) for i in range(3)],
                           use_tqdm=False)
    assert [r["response"]["body"]["choices"][0]["text"] for r in results[:3]] == [o.outputs[0].text for o in outputs]
    assert llm.engine.block_pool.num_used_blocks == 0


def test_it_runs_where_an_event_loop_already_runs(llm):
    # A notebook's cell runs inside ipykernel's loop: run_batch must not need a loop of its own.
    import asyncio

    async def from_a_running_loop():
        return run_batch(llm, [json.dumps(completion("n", PROMPTS[0]))], progress=False)

    (result,) = asyncio.run(from_a_running_loop())
    assert result["response"]["status_code"] == 200 and llm.engine.block_pool.num_used_blocks == 0


def test_the_command_line(tmp_path, capsys):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [completion("x", PROMPTS[0]), completion("y", PROMPTS[1], service_tier="flex", priority=-1)]
    source.write_text("\n".join([*map(json.dumps, lines), "[1, 2]"]) + "\n")
    assert main(["run-batch", "-i", str(source), "-o", str(target), "--model", MODEL,
                 "--max-num-seqs", "4", "--scheduling-policy", "priority", "--disable-progress-bar"]) == 0
    results = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in results] == [("x", 200), ("y", 200), (None, 400)]
    assert "2 succeeded, 1 failed" in capsys.readouterr().err
    assert main(["run-batch", "-i", str(tmp_path / "missing.jsonl"), "-o", str(target), "--model", MODEL]) == 2
