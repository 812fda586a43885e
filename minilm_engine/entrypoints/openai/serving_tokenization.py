"""vLLM's /tokenize, /detokenize and /tokenizer_info: the server's own tokenizer, over HTTP.

Contract: `tokenize` returns the ids the server would give the engine for a prompt (or chat
messages, rendered as /v1/chat/completions renders them), so `count` is a completion's
`prompt_tokens`.  `tokenizer_info` is the tokenizer's configuration and chat template, which
lm-evaluation-harness reads to tokenize through the server.  None touches the engine.
"""

from __future__ import annotations

from minilm_engine.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    warn_ignored,
)
from minilm_engine.entrypoints.openai.serving import APIError, OpenAIServing


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


# File locations on the server's disk are no configuration a client can use (vLLM drops them too).
_FILE_FIELDS = ("vocab_file", "merges_file", "tokenizer_file")


def tokenizer_info(serving: OpenAIServing) -> dict:
    tokenizer = serving.engine.llm.tokenizer
    config = {name: _plain(value) for name, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
              if name not in _FILE_FIELDS}
    config["tokenizer_class"] = type(tokenizer).__name__
    if serving.chat_format is not None:
        config["chat_template"] = serving.chat_format.template
    return config


def _plain(value):
    """JSON of a tokenizer's init argument: an AddedToken as its text, containers element-wise."""
    if hasattr(value, "content"):  # tokenizers.AddedToken
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
