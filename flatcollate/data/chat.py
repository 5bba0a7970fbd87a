"""Chat conversations to `input_ids` and an assistant-token mask, exact against `apply_chat_template`.

Two routes, chosen per template:

- the template has `{% generation %}` markers: the tokenizer returns `assistant_masks` itself
  (`return_assistant_tokens_mask=True`);
- otherwise the conversation is rendered turn by turn. Assistant turn `k` spans the tokens between the rendering of
  `messages[:k]` with the generation prompt and the rendering of `messages[:k + 1]`, so it covers the reply and its
  end-of-turn token. Every partial rendering must tokenize to an exact prefix of the full conversation's tokens;
  where a template renders a turn differently in context, a `ValueError` says so instead of guessing::

      tokens  <|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n | yo<|im_end|>\\n
      mask     0 ..............................................  0 | 1 ...........  1
"""

from collections.abc import Sequence

import jinja2
import numpy as np

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
}


def check_messages(messages, *, index: int | None, field: str) -> list[dict]:
    """Validate a conversation: a list of `{"role", "content"}` dicts with known roles and non-empty string content."""
    where = f"row {index}: field {field!r}" if index is not None else f"field {field!r}"
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError(f"{where} must be a non-empty list of messages, got {messages!r:.80}.")
    out = []
    for turn, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(
                f"{where}, message {turn}: expected a dict with 'role' and 'content', got {message!r:.80}."
            )
        if message["role"] not in ROLES:
            raise ValueError(f"{where}, message {turn}: role {message['role']!r} is not one of {ROLES}.")
        if not isinstance(message["content"], str) or not message["content"].strip():
            raise ValueError(
                f"{where}, message {turn}: content must be a non-empty string, got {message['content']!r:.80}."
            )
        out.append(message)
    if not any(m["role"] == "assistant" for m in out):
        raise ValueError(f"{where}: no assistant message, so there is nothing to train on.")
    return out


def sharegpt_to_messages(conversations, *, index: int | None, field: str) -> list[dict]:
    """ShareGPT `[{"from", "value"}]` turns to `[{"role", "content"}]` (`function_call` is an assistant turn and
    `observation` a tool turn)."""
    where = f"row {index}: field {field!r}" if index is not None else f"field {field!r}"
    if not isinstance(conversations, Sequence) or isinstance(conversations, str):
        raise ValueError(f"{where} must be a list of {{'from', 'value'}} turns, got {conversations!r:.80}.")
    messages = []
    for turn, item in enumerate(conversations):
        if not isinstance(item, dict) or item.get("from") not in SHAREGPT_ROLES or "value" not in item:
            raise ValueError(
                f"{where}, turn {turn}: expected {{'from': one of {sorted(SHAREGPT_ROLES)}, 'value': str}}, "
                f"got {item!r:.80}."
            )
        messages.append({"role": SHAREGPT_ROLES[item["from"]], "content": item["value"]})
    return messages


def has_generation_markers(template: str | None) -> bool:
    return template is not None and "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}")


class ChatRenderer:
    """Render conversations with a tokenizer's chat template and mark assistant tokens.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): has a chat template, or gets one from `chat_template`.
        chat_template (`str`, *optional*): a Jinja template to use instead of the tokenizer's.
        template_kwargs (`dict`, *optional*): extra template variables, e.g. `{"date_string": "26 Jul 2024"}`.
    """

    def __init__(self, tokenizer, *, chat_template: str | None = None, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise ValueError(
                f"{type(tokenizer).__name__} {tokenizer.name_or_path!r} has no chat template; pass chat_template=..., "
                "or use format='instruction' with a prompt template."
            )
        self.template_kwargs = dict(template_kwargs or {})
        self.use_markers = has_generation_markers(self.chat_template)

    def render(self, messages: list[dict], *, tools=None, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def tokens(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, messages: list[dict], *, tools=None, index: int | None = None, field: str = "messages"):
        """Token ids of the whole conversation and a 0/1 mask of the tokens the assistant writes.

        Returns:
            `(input_ids, assistant_mask)`: `list[int]` and `np.ndarray` of shape `(T,)`, int8.
        """
        where = f"row {index}: field {field!r}" if index is not None else f"field {field!r}"
        try:
            if self.use_markers:
                out = self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    chat_template=self.chat_template,
                    tokenize=True,
                    return_dict=True,
                    return_assistant_tokens_mask=True,
                    **self.template_kwargs,
                )
                return list(out["input_ids"]), np.asarray(out["assistant_masks"], dtype=np.int8)
            return self._encode_by_prefixes(messages, tools=tools, where=where)
        except jinja2.TemplateError as err:
            raise ValueError(f"{where}: the chat template rejected the conversation: {err}") from err

    def _encode_by_prefixes(self, messages: list[dict], *, tools, where: str):
        ids = self.tokens(self.render(messages, tools=tools))
        mask = np.zeros(len(ids), dtype=np.int8)
        # One rendering per assistant turn: the span of a turn is where its prefix renderings differ.
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = self._prefix_length(messages[:k], ids, tools=tools, where=where, generation=True)
            end = self._prefix_length(messages[: k + 1], ids, tools=tools, where=where, generation=False)
            if end <= start:
                raise ValueError(f"{where}, message {k}: the chat template renders no tokens for this reply.")
            mask[start:end] = 1
        return ids, mask

    def _prefix_length(self, messages, ids, *, tools, where: str, generation: bool) -> int:
        prefix = self.tokens(self.render(messages, tools=tools, add_generation_prompt=generation))
        if prefix != ids[: len(prefix)]:
            turn = len(messages) - 1
            raise ValueError(
                f"{where}: the chat template renders message {turn} differently inside the whole conversation than "
                "on its own, so assistant tokens cannot be marked exactly; pass a chat_template with "
                "{% generation %} markers."
            )
        return len(prefix)
