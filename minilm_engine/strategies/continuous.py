"""Continuous batching over paged memory: the engine in `minilm_engine.engine`, as a strategy.

Requests join the running batch as soon as a slot and KV blocks are free, and leave the moment
they finish ("conveyor-belt sushi" rather than the round table of static batching).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..engine.llm_engine import LLMEngine
from ..request import Request
from .base import Strategy


class ContinuousStrategy(Strategy):
    name = "continuous"

    def __init__(self, model, tokenizer, config, input_processor):
        super().__init__(model, tokenizer, config, input_processor)
        self.engine = LLMEngine(model, tokenizer, input_processor, config)

    def steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        pending = {r.request_id: r for r in requests}
        try:
            for request in requests:
                self.engine.add_prepared_request(request)
            while any(not r.finished for r in requests):
                advanced = self.engine.step_requests()
                yield [r for r in advanced if r.request_id in pending]
        finally:
            # A caller that stops early (or an error) must not leave blocks held.
            for r in requests:
                if not r.finished:
                    self.engine.abort_request(r.request_id)
