"""Token ids -> text, and the stop strings found in it (vLLM v1's `OutputProcessor`).

Contract: the scheduler ends a request on what ids alone decide (EOS, a stop token id, a
finished grammar, max_tokens) and never sees a tokenizer.  After every step the engine hands
`process(requests)` the requests that advanced; for each, this module

    1. extends `output_text` with what its new tokens complete (`detokenizer.py`), or, for a
       request that wants only its final text and has no stop strings, decodes it once at the end;
    2. searches the text for stop strings after each new token; at a match it cuts the text and
       returns a `StopStringMatch`, and the engine finishes the request there (tokens after the
       one that completed the string are dropped: speculative decoding brings several a step);
    3. names the tokens of the logprobs asked for (`Logprob.decoded_token`).

A streaming caller shows only `streamable_len(text, params)` of a running request's text: the
rest may still become a stop string or a multi-byte character.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minilm_engine.core.outputs import PositionLogprobs
from minilm_engine.core.request import Request, RequestStatus
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.entrypoints.detokenizer import IncrementalDetokenizer


@dataclass(frozen=True)
class StopStringMatch:
    """The request ends after its first `num_output_tokens` tokens (the last completed `stop`)."""

    request: Request
    stop: str
    num_output_tokens: int


@dataclass
class _RequestState:
    detokenizer: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    num_tokens: int = 0  # output tokens already decoded (or, for final-only text, seen)
    num_logprobs: int = 0  # output logprob rows whose tokens are named
    num_prompt_logprobs: int = 0  # prompt logprob rows whose tokens are named


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}

    def process(self, requests: list[Request]) -> list[StopStringMatch]:
        """Detokenize what `requests` got this step; the stop strings found (step 2 above)."""
        matches = []
        for request in requests:
            state = self._states.setdefault(request.request_id, _RequestState())
            self._name_logprobs(request, state)
            match = self._detokenize(request, state)
            if match is not None:
                matches.append(match)
            if match is not None or request.finished:
                del self._states[request.request_id]
        return matches

    def free(self, request_id: str) -> None:
        """Forget an aborted request (unknown ids are ignored)."""
        self._states.pop(request_id, None)

    def _detokenize(self, request: Request, state: _RequestState) -> StopStringMatch | None:
        params, ids = request.sampling_params, request.output_token_ids
        stops = params.stop_strings
        if request.incremental_text or stops:
            last = len(ids) - 1
            for k in range(state.num_tokens, len(ids)):
                request.output_text += state.detokenizer.step(self.tokenizer, ids[: k + 1])
                state.num_tokens = k + 1
                # A token that ended the request by its id (EOS, a stop id, the grammar) ends
                # it before any stop string it completes (vLLM checks in this order).
                if k == last and request.status is RequestStatus.FINISHED_STOPPED:
                    break
                for stop in stops:
                    at = request.output_text.find(stop)
                    if at != -1:
                        keep = at + len(stop) if params.include_stop_str_in_output else at
                        request.output_text = request.output_text[:keep]
                        return StopStringMatch(request, stop, k + 1)
        if request.finished:
            # Ended by a token or by length: the text is exactly decode(output tokens), a
            # character the last tokens left unfinished included.
            request.output_text += state.detokenizer.flush(self.tokenizer, ids)
        return None

    def _name_logprobs(self, request: Request, state: _RequestState) -> None:
        if request.logprobs is not None:
            self._name_rows(request.logprobs[state.num_logprobs :])
            state.num_logprobs = len(request.logprobs)
        if request.prompt_logprobs is not None:
            self._name_rows(request.prompt_logprobs[state.num_prompt_logprobs :])
            state.num_prompt_logprobs = len(request.prompt_logprobs)

    def _name_rows(self, rows: list[PositionLogprobs | None]) -> None:
        """Each token of each row decoded on its own (vLLM's `decoded_token`)."""
        if self.tokenizer is None:
            return
        for row in rows:
            for token_id, logprob in (row or {}).items():
                logprob.decoded_token = self.tokenizer.decode([token_id])


def streamable_len(text: str, params: SamplingParams) -> int:
    """How much of a running request's `text` may be streamed: not an unfinished character
    (decoded as U+FFFD) at its end, nor an end that is the beginning of a stop string."""
    end = len(text.rstrip("\ufffd"))
    for stop in params.stop_strings:
        for k in range(min(len(stop) - 1, end), 0, -1):
            if text[:end].endswith(stop[:k]):
                end -= k
                break
    return end
