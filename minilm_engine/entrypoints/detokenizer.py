"""Incremental detokenization: the text of a growing list of output tokens, a few tokens' work each.

Contract: `IncrementalDetokenizer().step(tokenizer, token_ids)` is called once per new token and
returns the text that token completed, possibly "".  The texts returned so far, joined, are a
prefix of `tokenizer.decode(token_ids, skip_special_tokens=True)`, equal to it except while the
last tokens hold an unfinished UTF-8 character (held back until it completes); `flush` returns
what is held back at the end.

Decoding everything every time is O(length^2) per request; decoding the new token alone is
wrong (a character split over tokens; SentencePiece drops the leading space of each `decode`).
So it decodes a short window that starts a few tokens back (as TGI and vLLM do):

    token_ids     ... t5  t6 | t7  t8 | t9          prefix_offset = 5, read_offset = 7
                      └ prefix ┘└ read ┘└ new ┘
    returned    = decode(t5 .. t9)[len(decode(t5 t6)):], unless it ends in "\\ufffd"
"""

from __future__ import annotations

from dataclasses import dataclass

REPLACEMENT_CHAR = "\ufffd"  # what decoding shows for the bytes of an unfinished character


def decode(tokenizer, token_ids: list[int]) -> str:
    """`tokenizer.decode(token_ids, skip_special_tokens=True)`, straight from the Rust tokenizer
    when that is all the Python wrapper would do (saving ~3 us of checks a call)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode(token_ids, skip_special_tokens=True)
    return backend.decode(token_ids, skip_special_tokens=True)


@dataclass
class IncrementalDetokenizer:
    prefix_offset: int = 0  # the window starts here: context for decoding, already returned
    read_offset: int = 0  # tokens before this have been returned as text

    def step(self, tokenizer, token_ids: list[int]) -> str:
        """The text completed by the last of `token_ids` (all the output tokens so far)."""
        prefix_text, new_text = self._window(tokenizer, token_ids)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # a skipped special token, or half a character: wait for more
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        return new_text[len(prefix_text) :]

    def flush(self, tokenizer, token_ids: list[int]) -> str:
        """What is still held back (bytes of a character that never completed), as `decode` shows it."""
        prefix_text, new_text = self._window(tokenizer, token_ids)
        self.prefix_offset = self.read_offset = len(token_ids)
        return new_text[len(prefix_text) :]

    def _window(self, tokenizer, token_ids: list[int]) -> tuple[str, str]:
        """(text already returned from the window, text of the whole window)."""
        prefix_text = decode(tokenizer, token_ids[self.prefix_offset : self.read_offset])
        return prefix_text, decode(tokenizer, token_ids[self.prefix_offset :])
