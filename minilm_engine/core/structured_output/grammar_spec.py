"""What a request's `structured_outputs` asks for, as one canonical, hashable spec.

Contract: `GrammarSpec.of(params)` turns vLLM's five spellings into (kind, text, any_whitespace),
equal for equal requests (a JSON schema re-serialised, its keys in their order), so the backend
compiles each grammar once.  `to_xgrammar(spec)` parses it (no tokenizer needed), raising
`ValueError` naming the field when the library cannot follow it: how `StructuredOutputsParams`
validates at construction.

    json={"type": "object", ...}  ->  GrammarSpec("json", '{"type": "object", ...}')
    json_object=True              ->  GrammarSpec("json_object", "")
    regex="[0-9]+"                ->  GrammarSpec("regex", "[0-9]+")
    choice=["yes", "no"]          ->  GrammarSpec("grammar", 'root ::= "yes" | "no"')
    grammar="root ::= ..."        ->  GrammarSpec("grammar", "root ::= ...")   (EBNF, xgrammar's)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import xgrammar

    from minilm_engine.core.sampling_params import StructuredOutputsParams


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "json", "json_object", "regex" or "grammar" (EBNF; a choice becomes one)
    text: str  # the schema as JSON text, the regex, or the EBNF ("" for json_object)
    any_whitespace: bool = True  # JSON only: whitespace allowed between tokens (vLLM's default)
    field: str = "json"  # the StructuredOutputsParams field it came from, for error messages

    @classmethod
    def of(cls, params: StructuredOutputsParams, disable_any_whitespace: bool = False) -> GrammarSpec:
        """`disable_any_whitespace`: the engine's setting, on top of the request's own."""
        any_whitespace = not (params.disable_any_whitespace or disable_any_whitespace)
        if params.json is not None:
            try:
                schema = json.loads(params.json) if isinstance(params.json, str) else params.json
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got {params.json!r}")
            return cls("json", json.dumps(schema), any_whitespace, "json")
        if params.json_object:
            return cls("json_object", "", any_whitespace, "json_object")
        if params.regex is not None:
            return cls("regex", params.regex, field="regex")
        if params.choice is not None:
            return cls("grammar", choice_as_ebnf(params.choice), field="choice")
        return cls("grammar", params.grammar, field="grammar")


def choice_as_ebnf(choice: list[str]) -> str:
    """["yes", "no"] -> 'root ::= "yes" | "no"' (each choice a quoted literal, JSON-escaped)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choice)


def to_xgrammar(spec: GrammarSpec) -> xgrammar.Grammar:
    """The spec as an xgrammar `Grammar`; ValueError naming the field if xgrammar refuses it."""
    import xgrammar as xgr  # imported on first use: a second or two that plain requests never pay

    try:
        if spec.kind == "json":
            return xgr.Grammar.from_json_schema(spec.text, any_whitespace=spec.any_whitespace)
        if spec.kind == "json_object":  # an object, not any JSON value (vLLM's choice too)
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=spec.any_whitespace)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.text)
        return xgr.Grammar.from_ebnf(spec.text)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"structured_outputs.{spec.field}: {_what(spec)} this engine cannot follow: "
                         f"{_first_line(e)}") from None


def _what(spec: GrammarSpec) -> str:
    return {"json": "a JSON schema", "regex": "a regular expression", "json_object": "a JSON grammar"}.get(
        spec.kind, "a grammar (EBNF, xgrammar's dialect: root ::= ...)")


def _first_line(error: Any) -> str:
    """xgrammar's messages start with '[time] file.cc:line: ': keep what follows."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text
