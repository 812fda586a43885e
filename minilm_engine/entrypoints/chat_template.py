"""Chat messages -> one prompt string: the checkpoint's own chat template, or the noodle shop's.

Contract: `chat_format_for(tokenizer, model_path)` returns the `ChatFormat` to use, or None when
the model has no template we know (the server then answers chat requests with a clear 400).
`render_chat(tokenizer, fmt, messages)` renders with Hugging Face's `apply_chat_template`, the
same Jinja machinery every checkpoint's template runs on, and ends with the prompt that asks the
model for the assistant's turn.

The shipped models were never trained on a chat format: they know the noodle shop's dialogues
(`course/noodle_corpus.py`, `make_dialogue`), where each line is "Name: words".  So their
template writes the conversation as such a dialogue, the assistant as a waiter and the user as a
guest, and the waiter's line ends at the newline (`default_stop`):

    system     -> its text, on its own line (the corpus's house rules come first, like this)
    user       -> "Ana: I would like one bowl of Miso Ramen.\\n"
    assistant  -> "Sam: So that is one bowl of Miso Ramen for table 4.\\n"
    (prompt)   -> "Sam:"      the model continues the waiter's line

Tool calling uses the Hermes format (Qwen's templates use it too), which
`entrypoints/openai/tool_calls.py` reads back:

    tools      -> 'Tool order: Order bowls. {"type": "object", ...}\\n' each, after the system line
    assistant  -> 'Sam: <tool_call>{"name": "order", "arguments": {...}}</tool_call>\\n'  (its calls)
    tool       -> "Tool: {...}\\n"   (a call's result)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minilm_engine.model.loader import CHECKPOINTS_DIR

GUEST_NAME = "Ana"  # a guest of the corpus (CUSTOMERS)
WAITER_NAME = "Sam"  # a waiter of the corpus (WAITERS)

NOODLE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] | trim }}\n"
    "{% endif %}"
    "{% if loop.first %}{% for tool in tools or [] %}"
    "Tool {{ tool.function.name }}: "
    "{% if tool.function.description %}{{ tool.function.description | trim }} {% endif %}"
    "{{ tool.function.parameters | tojson }}\n"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ message.get('name') or '" + GUEST_NAME + "' }}: {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'tool' %}Tool: {{ message['content'] | trim }}\n"
    "{% elif message['role'] != 'system' %}"
    "{{ message.get('name') or '" + WAITER_NAME + "' }}: {{ message['content'] | trim }}"
    "{% for call in message.get('tool_calls') or [] %}<tool_call>"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{{ '\\n' }}"  # (a newline right after a tag is dropped: Jinja's trim_blocks)
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + WAITER_NAME + ":{% endif %}"
)


@dataclass(frozen=True)
class ChatFormat:
    template: str
    default_stop: tuple[str, ...] = ()  # stop strings added to every chat request
    source: str = "checkpoint"  # "checkpoint" (its tokenizer's template) or "noodle dialogue"


def chat_format_for(tokenizer, model_path: str | Path) -> ChatFormat | None:
    """The checkpoint's own template when it has one; the dialogue format for shipped models."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return ChatFormat(own)
    if Path(model_path).resolve().parent == CHECKPOINTS_DIR:
        return ChatFormat(NOODLE_CHAT_TEMPLATE, default_stop=("\n",), source="noodle dialogue")
    return None


def render_chat(tokenizer, fmt: ChatFormat, messages: list[dict], template_kwargs: dict | None = None) -> str:
    """The prompt text for `messages` (dicts with "role", "content" and an optional "name");
    `template_kwargs` are extra variables for the template (vLLM's `chat_template_kwargs`, e.g.
    {"enable_thinking": False} for Qwen3's)."""
    return tokenizer.apply_chat_template(
        messages, chat_template=fmt.template, tokenize=False, add_generation_prompt=True,
        **(template_kwargs or {}),
    )
