"""Engine logprobs -> OpenAI's two wire shapes.

The engine gives one {token id: Logprob} per position (the chosen token, then the top-k), None
for a prompt's first token.  OpenAI wants:

    /v1/completions   {"tokens", "token_logprobs", "top_logprobs": [{text: lp}], "text_offset"}
    /v1/chat          {"content": [{"token", "logprob", "bytes", "top_logprobs": [{...}]}]}

JSON has no -inf: a logprob below -9999 is sent as -9999 (vLLM's rule).
"""

from __future__ import annotations

from minilm_engine.core.outputs import PositionLogprobs
from minilm_engine.entrypoints.openai.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
)

_FLOOR = -9999.0


def _clamp(logprob: float) -> float:
    return max(logprob, _FLOOR)


def _token_text(token_id: int, row: PositionLogprobs | None, tokenizer) -> str:
    entry = None if row is None else row.get(token_id)
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    return tokenizer.decode([token_id])


def completion_logprobs(
    token_ids: list[int], rows: list[PositionLogprobs | None], tokenizer, initial_offset: int = 0
) -> CompletionLogprobs:
    """Per token: its text, its logprob, {text: logprob} of the chosen and top-k tokens, and
    where its text starts (offsets run on from `initial_offset`)."""
    out = CompletionLogprobs()
    offset = initial_offset
    for token_id, row in zip(token_ids, rows):
        text = _token_text(token_id, row, tokenizer)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if row is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_clamp(row[token_id].logprob))
        out.top_logprobs.append({
            (lp.decoded_token if lp.decoded_token is not None else tokenizer.decode([tid])): _clamp(lp.logprob)
            for tid, lp in row.items()
        })
    return out


def chat_logprobs(
    token_ids: list[int], rows: list[PositionLogprobs], num_top: int, tokenizer
) -> ChatLogprobs:
    """Per output token: its text, logprob and UTF-8 bytes, and the `num_top` most likely
    tokens at its position, best first."""
    content = []
    for token_id, row in zip(token_ids, rows):
        ranked = sorted((lp.rank, tid, lp) for tid, lp in row.items() if lp.rank is not None)
        top = [_top(_token_text(tid, row, tokenizer), lp.logprob) for _, tid, lp in ranked[:num_top]]
        text = _token_text(token_id, row, tokenizer)
        content.append(ChatTokenLogprob(
            token=text, logprob=_clamp(row[token_id].logprob), bytes=list(text.encode("utf-8")), top_logprobs=top,
        ))
    return ChatLogprobs(content=content)


def _top(text: str, logprob: float) -> ChatTopLogprob:
    return ChatTopLogprob(token=text, logprob=_clamp(logprob), bytes=list(text.encode("utf-8")))
