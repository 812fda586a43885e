"""Tool calls, as vLLM serves them.  A forced choice (`tool_choice` "required" or a named
function) is a JSON schema the output must follow, its text read back as OpenAI's `tool_calls`;
with "auto" the model may write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the Hermes format the chat template shows it), read by `read_tagged_tool_calls`.

    named "order":   output  {"dish": "ramen"}                     -> one call of order
    "required":      output  [{"name": "order", "parameters": {...}},
                              {"name": "pay",   "parameters": {...}}]  -> two calls, in order

Calls come back as `[{"id", "type": "function", "function": {"name", "arguments"}}]`, the
arguments as JSON text; `tools` are plain dicts.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object"}  # a function declared without parameters


def named_function(tool_choice: Any) -> str | None:
    """{"type": "function", "function": {"name": "order"}} -> "order"; anything else None."""
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def forced_call_schema(tools: list[dict], tool_choice: Any, parallel_tool_calls: bool = True) -> dict | None:
    """The JSON schema of a forced call (see the module docstring), None for tool_choice "none".
    `parallel_tool_calls=False` (OpenAI's field): "required" makes exactly one call."""
    if tool_choice == "none":
        return None
    by_name = {tool["function"]["name"]: tool["function"].get("parameters") or ANY_OBJECT for tool in tools}
    name = named_function(tool_choice)
    if name is not None:
        if name not in by_name:
            raise ValueError(f"tool_choice names the function {name!r}, which is not in tools "
                             f"(functions: {sorted(by_name)})")
        return by_name[name]
    if tool_choice == "required":
        one_call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [n]}, "parameters": p},
                     "required": ["name", "parameters"]} for n, p in by_name.items()]
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": one_call}}
        return calls if parallel_tool_calls else {**calls, "maxItems": 1}
    raise ValueError(f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": '
                     f'{{"name": ...}}}}, got {tool_choice!r}')


def read_tool_calls(text: str, named: str | None) -> list[dict] | None:
    """The calls in a finished forced output; None when the text does not parse (cut short)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = [(named, value)] if named is not None else [(call["name"], call["parameters"]) for call in value]
    return [_call(name, arguments) for name, arguments in calls]


TAGGED_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def read_tagged_tool_calls(text: str) -> tuple[str | None, list[dict]] | None:
    """"Sure. <tool_call>{"name": "order", "arguments": {...}}</tool_call>" -> ("Sure.", [call]);
    None when the text holds no call, or one that does not parse (then it is plain text)."""
    bodies = TAGGED_CALL.findall(text)
    if not bodies:
        return None
    calls = []
    for body in bodies:
        try:
            call = json.loads(body)
            calls.append(_call(call["name"], call.get("arguments", {})))
        except (ValueError, KeyError, TypeError):
            return None
    return text[: text.index("<tool_call>")].strip() or None, calls


def _call(name: str, arguments: Any) -> dict:
    if not isinstance(name, str):
        raise TypeError(f"a tool call's name must be a string, got {name!r}")
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}
