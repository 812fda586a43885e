"""Text the shipped models were trained on: a synthetic noodle shop (see `noodle_corpus`)."""

from minilm_engine.data.noodle_corpus import (
    DOCUMENT_KINDS,
    SYSTEM_PROMPT,
    generate_documents,
    make_document,
    sample_prompts,
)

__all__ = [
    "DOCUMENT_KINDS",
    "SYSTEM_PROMPT",
    "generate_documents",
    "make_document",
    "sample_prompts",
]
