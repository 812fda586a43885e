"""Chat messages -> one prompt string: the checkpoint's own chat template, or the noodle shop's.

Contract: `chat_format_for(tokenizer, model_path)` returns the `ChatFormat` to use, or None when
the model has no template we know (chat requests then get a clear 400); `render_chat` renders
with Hugging Face's `apply_chat_template` and ends with the prompt for the assistant's turn.

The shipped models know the noodle shop's dialogues ("Name: words" lines), not a chat format,
so their template writes the conversation as such a dialogue, the waiter's line ending at the
newline (`default_stop`); tool calls use the Hermes format, read back by `openai/tool_calls.py`:

    system     -> its text, on its own line; then 'Tool order: Order bowls. {...schema}' each
    user       -> "Ana: I would like one bowl of Miso Ramen.\\n"
    assistant  -> 'Sam: <tool_call>{"name": "order", "arguments": {...}}</tool_call>\\n'
    tool       -> "Tool: {...}\\n"   (a call's result)
    (prompt)   -> "Sam:"      the model continues the waiter's line
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


def chat_format_for(tokenizer, model_path: str | Path) -> ChatFormat | None:
    """The checkpoint's own template when it has one; the dialogue format for shipped models."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return ChatFormat(own)
    if Path(model_path).resolve().parent == CHECKPOINTS_DIR:
        return ChatFormat(NOODLE_CHAT_TEMPLATE, default_stop=("\n",))
    return None


def render_chat(tokenizer, fmt: ChatFormat, messages: list[dict], template_kwargs: dict | None = None) -> str:
    """The prompt text for `messages` (dicts with "role", "content" and an optional "name");
    `template_kwargs` are extra variables for the template (vLLM's `chat_template_kwargs`, e.g.
    {"enable_thinking": False} for Qwen3's)."""
    return tokenizer.apply_chat_template(
        messages, chat_template=fmt.template, tokenize=False, add_generation_prompt=True,
        **(template_kwargs or {}),
    )
