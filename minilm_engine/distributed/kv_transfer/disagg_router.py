"""Disaggregated prefill: a router in front of a prefill engine and a decode engine.

Contract: `DisaggRouter(kv_producer, kv_consumer)` takes two `LLM`s of one checkpoint.  Every
request runs its prompt on the producer and samples its first token there; the router then
detaches it and the connector (`kv_connector.py`) copies its KV into the consumer, where it
decodes to the end.  `generate` returns what `LLM.generate` returns, token for token (a
request's generator travels with it).

    add_request ─> kv_producer ─> first token ─> detach ─> pending ─> connector ─> kv_consumer
                   (prefills)                            (oldest first)  copies KV  (decodes)

`step()` is `step_prefill`, `transfer_pending`, `step_decode` (separate for a caller that times
each engine on its own clock).  Backpressure: while a hand-over waits for the consumer's room,
the producer keeps that prompt's blocks and runs no more prefills.  A request that ends on its
first token never leaves the producer.  Unlike vLLM's proxy (a max_tokens=1 copy to the
prefill instance, the original to the decode instance), one `Request` moves between engines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from minilm_engine.entrypoints.input_processor import PromptType
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.outputs import RequestOutput
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.distributed.kv_transfer.kv_connector import InProcessKVConnector, KVTransfer


class DisaggRouter:
    """Invariant: every live request is in exactly one of the producer, `pending` and the
    consumer; `pending` requests hold producer blocks and are in neither engine's batch."""

    def __init__(self, kv_producer: LLM, kv_consumer: LLM):
        for role, llm in (("kv_producer", kv_producer), ("kv_consumer", kv_consumer)):
            if getattr(llm, "strategy_name", "continuous") != "continuous":
                raise ValueError(f"the {role} must run the engine (strategy='continuous'), got {llm.strategy_name!r}")
        self.kv_producer = kv_producer
        self.kv_consumer = kv_consumer
        self.connector = InProcessKVConnector(kv_producer.engine, kv_consumer.engine)
        # One output processor for both: a request's text goes on where the producer left it.
        kv_consumer.engine.output_processor = kv_producer.engine.output_processor
        self.pending: deque[Request] = deque()  # prefilled, waiting for the consumer's room
        self.requests: dict[str, Request] = {}  # every live request, by id

    @classmethod
    def from_model(
        cls,
        model: str | Path | None = None,
        *,
        prefill: dict[str, Any] | None = None,
        decode: dict[str, Any] | None = None,
        **common: Any,
    ) -> DisaggRouter:
        """Load `model` twice: `LLM(model, **common, **prefill)` produces, `**decode` consumes."""
        return cls(LLM(model, **common, **(prefill or {})), LLM(model, **common, **(decode or {})))

    @property
    def stats(self):
        """The connector's `KVTransferStats`: every hand-over's tokens, bytes and seconds."""
        return self.connector.stats

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: PromptType,
                    sampling_params: SamplingParams | None = None) -> Request:
        """Validate, tokenize (the producer's `InputProcessor`) and queue on the producer."""
        params = sampling_params or SamplingParams()
        request = self.kv_producer.input_processor.make_request(request_id, prompt, params)
        self.add_prepared_request(request)
        return request

    def add_prepared_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the router")
        self.kv_producer.engine.add_prepared_request(request)
        self.requests[request.request_id] = request

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks, wherever it is; unknown ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request in self.pending:
            self.pending.remove(request)
            self.kv_producer.engine.block_manager.free(request_id)
            self.kv_producer.engine.output_processor.free(request_id)
            request.abort()
        else:
            self.kv_producer.engine.abort_request(request_id)
            self.kv_consumer.engine.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- one step ---------------------------------------------------------------------------

    def step_prefill(self) -> list[Request]:
        """One producer step, unless a hand-over is pending (backpressure); the requests that got
        their first token, each detached for the consumer unless it finished right there."""
        producer = self.kv_producer.engine
        if self.pending or not producer.has_unfinished_requests():
            return []
        advanced = producer.step_requests()
        for request in advanced:
            if request.finished:
                del self.requests[request.request_id]
            else:
                producer.detach_request(request.request_id)
                self.pending.append(request)
        return advanced

    def transfer_pending(self, ready: Callable[[Request], bool] | None = None) -> list[KVTransfer]:
        """Hand pending requests to the consumer, oldest first, while it has room (and while
        `ready(request)`, if given: a caller with a clock per engine)."""
        done = []
        while self.pending and (ready is None or ready(self.pending[0])):
            record = self.connector.transfer(self.pending[0])
            if record is None:
                break
            self.pending.popleft()
            done.append(record)
        return done

    def step_decode(self) -> list[Request]:
        """One consumer step (if it has requests); the requests that got a token."""
        consumer = self.kv_consumer.engine
        if not consumer.has_unfinished_requests():
            return []
        advanced = consumer.step_requests()
        for request in advanced:
            if request.finished:
                del self.requests[request.request_id]
        return advanced

    def step(self) -> list[RequestOutput]:
        """A producer step, the hand-overs, a consumer step: the outputs of the requests that
        advanced (once each, as they stand after the step)."""
        advanced = self.step_prefill()
        self.transfer_pending()
        advanced += self.step_decode()
        return [request.to_output() for request in {r.request_id: r for r in advanced}.values()]

    # -- offline generation -----------------------------------------------------------------

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Completions of every prompt, in order; ids and seeds as `LLM.generate` gives them."""
        requests = self.kv_producer.make_requests(prompts, sampling_params)
        try:
            for request in requests:
                request.incremental_text = False  # only finished texts are returned: decode once
                self.add_prepared_request(request)
            while any(not r.finished for r in requests):
                num_steps = self.kv_producer.engine.num_steps + self.kv_consumer.engine.num_steps
                self.step()
                if self.kv_producer.engine.num_steps + self.kv_consumer.engine.num_steps == num_steps:
                    raise RuntimeError("neither engine could step (the consumer's pool too small?)")
        finally:
            # A caller that stops early (or an error) must not leave blocks held.
            for request in requests:
                if not request.finished:
                    self.abort_request(request.request_id)
        return [request.to_output() for request in requests]
