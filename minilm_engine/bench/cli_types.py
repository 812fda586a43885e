"""argparse value types the command lines share (`serve`, `bench serve`): each turns one
argument's text into a value or raises `argparse.ArgumentTypeError` saying what was wrong."""

from __future__ import annotations

import argparse
import json


def json_object(text: str) -> dict:
    """A JSON object given on the command line, e.g. '{"num_speculative_tokens": 3}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def json_string_list(text: str) -> list[str]:
    """A JSON list of strings given on the command line, e.g. '["http://localhost:3000"]'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value
