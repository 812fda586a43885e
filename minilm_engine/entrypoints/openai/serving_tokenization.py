"""vLLM's /tokenize and /detokenize: the server's own tokenizer, over HTTP.

Contract: `tokenize(serving, body)` returns the ids the server would give the engine for that
prompt (or for those chat messages, rendered with the same chat template as /v1/chat/completions),
so `count` equals the `prompt_tokens` a completion of it reports; `detokenize` returns the text
of a list of ids.  Both raise `APIError` for a model not served, a body with neither or both of
prompt and messages, or ids outside the vocabulary.  Neither touches the engine.
"""

from __future__ import annotations

from .protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, warn_ignored
from .serving import APIError, OpenAIServing


def tokenize(serving: OpenAIServing, body: TokenizeRequest) -> dict:
    serving.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either prompt (text) or messages (a chat), not both and not neither",
                       "prompt", "invalid_value")
    warn_ignored(body.ignored_fields())
    if body.prompt is not None:
        text = body.prompt
    else:
        text = serving.render(body.messages, body.chat_template_kwargs)
    tokenizer = serving.engine.llm.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens, verbose=False)
    strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=serving.max_model_len, tokens=ids,
                            token_strs=strs).model_dump()


def detokenize(serving: OpenAIServing, body: DetokenizeRequest) -> dict:
    serving.check_model(body.model)
    warn_ignored(body.ignored_fields())
    vocab_size = serving.engine.llm.input_processor.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"tokens must be ints in [0, {vocab_size}), got {bad[:5]}", "tokens", "invalid_value")
    text = serving.engine.llm.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text).model_dump()
