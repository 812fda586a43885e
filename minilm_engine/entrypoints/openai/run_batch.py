"""`minilm-engine run-batch -i requests.jsonl -o results.jsonl`: OpenAI's batch files, like
`vllm run-batch`.

Contract: `run_batch(llm, lines)` takes the lines of a batch input file, one request a line,

    {"custom_id": "q1", "method": "POST", "url": "/v1/completions" | "/v1/chat/completions",
     "body": {... the body you would POST to that route ...}}

and returns one output line per input line (blank lines skipped), in input order:

    {"id": "batch_req_...", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "cmpl-1", "body": {... what serve answers ...}},
     "error": null}

A bad line gets the status and error body `serve` would answer, and `"error": {"code",
"message"}`; the other lines still run.  Bodies go through the server's own code (`serving.py`),
all submitted at once so that the engine runs at full throughput.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterable

from minilm_engine.bench.serve import run_sync
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine
from minilm_engine.entrypoints.chat_template import chat_format_for
from minilm_engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from minilm_engine.entrypoints.openai.serving import APIError, OpenAIServing, parse_body

ROUTES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


def output_line(custom_id: str | None, status: int, request_id: str | None, body: dict,
                error: APIError | None = None) -> dict:
    """One line of the output file, in OpenAI's batch output shape."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None if error is None else {"code": error.code, "message": error.message},
    }


def parse_line(text: str, line_number: int, seen: dict[str, int]) -> tuple[str | None, dict | APIError]:
    """A batch input line -> (custom_id, the item), or (custom_id if one was read, the error)."""
    def fail(message: str, param: str | None, custom_id: str | None = None) -> tuple[str | None, APIError]:
        return custom_id, APIError(400, f"line {line_number}: {message}", param, "invalid_batch_line")

    try:
        item = json.loads(text)
    except json.JSONDecodeError as e:
        return fail(f"not valid JSON: {e}", None)
    if not isinstance(item, dict):
        return fail(f"a line must be a JSON object, got {type(item).__name__}", None)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return fail(f"custom_id must be a non-empty string, got {custom_id!r}", "custom_id")
    if custom_id in seen:
        return fail(f"custom_id {custom_id!r} is already used by line {seen[custom_id]}", "custom_id", custom_id)
    seen[custom_id] = line_number
    if item.get("method") != "POST":
        return fail(f"method must be \"POST\", got {item.get('method')!r}", "method", custom_id)
    if item.get("url") not in ROUTES:
        return fail(f"url must be one of {sorted(ROUTES)}, got {item.get('url')!r}", "url", custom_id)
    if "body" not in item:
        return fail("body: this field is required", "body", custom_id)
    return custom_id, item


async def run_one(serving: OpenAIServing, custom_id: str, item: dict) -> dict:
    """One request through the server's code: parse, prepare, submit, answer."""
    try:
        body = parse_body(item["body"], ROUTES[item["url"]])
        if body.stream:
            raise APIError(400, "stream must be false in a batch (results are written as a whole)",
                           "stream", "invalid_value")
        prepared = serving.prepare(body)
        streams = await serving.submit(prepared)
        answer = await serving.response(prepared, streams)
        return output_line(custom_id, 200, prepared.response_id, answer)
    except APIError as e:
        return output_line(custom_id, e.status, None, e.body(), e)
    except RuntimeError as e:  # a failed engine step: this request is lost, the others go on
        error = APIError(500, str(e), None, "engine_error", type="server_error")
        return output_line(custom_id, 500, None, error.body(), error)


async def run_batch_async(llm: LLM, lines: Iterable[str], served_model_names: list[str] | None = None,
                          progress: bool = True) -> list[dict]:
    from tqdm.auto import tqdm

    engine = AsyncLLMEngine(llm)
    names = list(served_model_names or [llm.model_name])
    serving = OpenAIServing(engine, names, chat_format_for(llm.tokenizer, llm.model_path))
    seen: dict[str, int] = {}
    parsed = [parse_line(text, number, seen) for number, text in enumerate(lines, start=1) if text.strip()]
    bar = tqdm(total=len(parsed), desc="Running batch", unit="req", file=sys.stderr, disable=not progress)

    async def job(custom_id: str | None, item: dict | APIError) -> dict:
        try:
            if isinstance(item, APIError):
                return output_line(custom_id, item.status, None, item.body(), item)
            return await run_one(serving, custom_id, item)
        finally:
            bar.update(1)

    engine.start(asyncio.get_running_loop())
    try:
        # All at once: the engine fills its batch from the whole file.
        return list(await asyncio.gather(*(job(custom_id, item) for custom_id, item in parsed)))
    finally:
        engine.shutdown()  # nothing is left running: every block back in the pool
        bar.close()


def run_batch(llm: LLM, lines: Iterable[str], served_model_names: list[str] | None = None,
              progress: bool = True) -> list[dict]:
    """The output lines for the input `lines` (module docstring), also where an event loop runs."""
    return run_sync(run_batch_async(llm, lines, served_model_names, progress))
