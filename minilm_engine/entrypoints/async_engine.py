"""One engine, many connections: the `LLMEngine` stepping in a background thread, fed from asyncio.

Contract: from `start()` to `shutdown()` only this thread touches `llm.engine`.  Coroutines call
`await add_request(request)` (raising the engine's ValueError/TypeError for a bad request) and
iterate the returned `RequestStream` for `StreamDelta`s, one per step that gave the request a
token; `abort(request_id)` (from anywhere) frees its blocks at the loop's next turn.
`shutdown()` aborts what is left: every stream ends, no block stays allocated.

    event loop (many connections)             engine thread (one)
    add_request ──> commands ──┐              while running:
    abort       ──> commands ──┤  condition     apply commands (add / abort)
                               └──────────>     engine.step_requests()
    RequestStream.queue <── call_soon_threadsafe ── deltas of the requests that advanced

Why a thread: a step is milliseconds of synchronous torch work that would stall every
connection on the event loop; torch releases the GIL inside its kernels.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints.output_processor import streamable_len
from minilm_engine.core.outputs import PositionLogprobs
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class StreamDelta:
    """What one engine step added to one request (text may be "" while a stop string or a
    multi-byte character is still undecided)."""

    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort" once finished
    num_prompt_tokens: int
    num_output_tokens: int  # so far, this delta included
    logprobs: list[PositionLogprobs] | None = None  # of token_ids, if the request asked
    stop_reason: int | str | None = None  # once finished: the stop string or token id (vLLM's)


@dataclass
class EngineStats:
    """A snapshot the engine thread refreshes after every step (read by /metrics)."""

    num_running: int = 0
    num_waiting: int = 0
    num_used_blocks: int = 0
    num_blocks: int = 0
    num_preemptions: int = 0  # total since start
    num_prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, total
    num_prefix_cache_hits: int = 0  # of which found cached
    num_aborted: int = 0  # requests aborted (disconnects, shutdown), total
    num_steps: int = 0

    @property
    def kv_cache_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0


class RequestStream:
    """The deltas of one request, as an async iterator; ends after the finishing delta."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.queue: asyncio.Queue[StreamDelta | BaseException] = asyncio.Queue()
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamDelta:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item


@dataclass
class _Tracked:
    """Engine-thread bookkeeping of one live request."""

    request: Request
    stream: RequestStream
    num_text_sent: int = 0
    num_tokens_sent: int = 0


@dataclass
class _Command:
    kind: str  # "add" or "abort"
    request_id: str
    request: Request | None = None
    stream: RequestStream | None = None
    future: asyncio.Future | None = None


_ENGINES_IN_USE: weakref.WeakSet = weakref.WeakSet()  # LLMEngines some AsyncLLMEngine is stepping


class AsyncLLMEngine:
    def __init__(self, llm: LLM, on_request_end: Callable[[Request], None] | None = None):
        self.llm = llm
        # Called on the engine thread when a request ends (metrics) and when one enters the engine.
        self.on_request_end = on_request_end
        self.on_request_added: Callable[[Request], None] | None = None
        self.engine = llm.engine  # raises for a strategy without a step-wise engine
        self.stats = EngineStats(num_blocks=self.engine.block_pool.num_blocks)
        self.max_model_len = llm.max_model_len
        self._cond = threading.Condition()
        self._commands: list[_Command] = []
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._running = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._num_ids = 0
        self.step_error: BaseException | None = None  # the last step that raised, if any

    # -- life cycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the engine thread; deltas are delivered on `loop` (default: the running one)."""
        if self._thread is not None or self.engine in _ENGINES_IN_USE:
            raise RuntimeError("this LLM's engine is already being served (one engine thread per engine)")
        _ENGINES_IN_USE.add(self.engine)
        self._loop = loop or asyncio.get_running_loop()
        self._running = True
        self._thread = threading.Thread(target=self._run, name="minilm-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort every live request, stop the thread and wait for it (idempotent)."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
            _ENGINES_IN_USE.discard(self.engine)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- requests (event loop side) ---------------------------------------------------------

    def new_request_id(self, prefix: str = "cmpl") -> str:
        self._num_ids += 1
        return f"{prefix}-{self._num_ids}"

    def make_requests(self, request_id: str, prompt, params: SamplingParams, priority: int = 0) -> list[Request]:
        """The n samples of one prompt (`InputProcessor.make_requests`); touches no engine state."""
        return self.llm.input_processor.make_requests(request_id, prompt, params, priority)

    async def add_request(self, request: Request) -> RequestStream:
        """Queue a prepared request; raises the engine's error if it refuses it."""
        if not self.is_running:
            raise RuntimeError("the engine is not running (shutting down)")
        stream = RequestStream(request.request_id)
        future = asyncio.get_running_loop().create_future()
        self._submit(_Command("add", request.request_id, request, stream, future))
        try:
            await future  # raises what add_prepared_request raised
        except asyncio.CancelledError:
            self.abort(request.request_id)  # the caller left before the engine took it
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks at the loop's next turn (unknown ids: ignored)."""
        self._submit(_Command("abort", request_id))

    def _submit(self, command: _Command) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    # -- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._commands and not self._tracked:
                    self._cond.wait()
                commands, self._commands = self._commands, []
                running = self._running
            for command in commands:
                self._apply(command)
            if not running:
                for request_id in list(self._tracked):
                    self._abort(request_id)
                return
            if self.engine.has_unfinished_requests():
                self._step()

    def _apply(self, command: _Command) -> None:
        if command.kind == "abort":
            self._abort(command.request_id)
            return
        try:
            self.engine.add_prepared_request(command.request)
        except (ValueError, TypeError) as e:
            self._deliver(_settle, (command.future, e))
            return
        self._tracked[command.request_id] = _Tracked(command.request, command.stream)
        self._deliver(_settle, (command.future, None))
        if self.on_request_added is not None:
            self.on_request_added(command.request)
        self._refresh_stats()

    def _abort(self, request_id: str) -> None:
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            return
        self.engine.abort_request(request_id)
        self.stats.num_aborted += 1
        self._send(tracked, final_reason="abort")
        self._ended(tracked.request)
        self._refresh_stats()

    def _step(self) -> None:
        try:
            advanced = self.engine.step_requests()
        except Exception as e:  # the engine is broken for these requests; fail them, keep serving
            self.step_error = e
            for request_id in list(self._tracked):
                tracked = self._tracked.pop(request_id)
                self.engine.abort_request(request_id)
                self._deliver(tracked.stream.queue.put_nowait, RuntimeError(f"engine step failed: {e}"))
            self._refresh_stats()
            return
        for request in advanced:
            tracked = self._tracked.get(request.request_id)
            if tracked is None:
                continue
            self._send(tracked)
            if request.finished:
                del self._tracked[request.request_id]
                self._ended(request)
        self._refresh_stats()

    def _send(self, tracked: _Tracked, final_reason: str | None = None) -> None:
        request = tracked.request
        finished = final_reason is not None or request.finished
        text = request.output_text
        # Hold back text that may still become a stop string or a multi-byte character.
        safe = len(text) if finished else streamable_len(text, request.sampling_params)
        new_text = text[tracked.num_text_sent:safe] if safe > tracked.num_text_sent else ""
        new_ids = request.output_token_ids[tracked.num_tokens_sent:]
        tracked.num_text_sent = max(tracked.num_text_sent, safe)
        tracked.num_tokens_sent = len(request.output_token_ids)
        delta = StreamDelta(
            text=new_text,
            token_ids=list(new_ids),
            finished=finished,
            finish_reason=final_reason or request.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=len(request.output_token_ids),
            logprobs=None if request.logprobs is None else request.logprobs[len(request.output_token_ids) - len(new_ids):],
            stop_reason=request.stop_reason,
        )
        self._deliver(tracked.stream.queue.put_nowait, delta)

    def _ended(self, request: Request) -> None:
        if self.on_request_end is not None:
            self.on_request_end(request)

    def _deliver(self, callback, value) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, value)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _refresh_stats(self) -> None:
        engine, stats = self.engine, self.stats
        stats.num_used_blocks = engine.block_pool.num_used_blocks
        scheduler = engine.scheduler
        stats.num_running = len(scheduler.running)
        stats.num_waiting = len(scheduler.waiting)
        stats.num_preemptions = scheduler.num_preemptions
        stats.num_prefix_cache_queries = scheduler.num_prefix_cache_queries
        stats.num_prefix_cache_hits = scheduler.num_prefix_cache_hits
        stats.num_steps = engine.num_steps


def _settle(outcome: tuple[asyncio.Future, BaseException | None]) -> None:
    """Resolve an add_request future on the event loop, unless its caller already left."""
    future, error = outcome
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
