"""Chat conversations to `input_ids` and a mask of the tokens the assistant writes, in one rendering.

The conversation is rendered once with the chat template and tokenized once with character offsets
(`add_special_tokens=False`: the template writes BOS and the other special tokens itself), so `input_ids` are exactly
`apply_chat_template(tokenize=True)`. Each reply's content is found in the rendered text, in order, and the tokens
overlapping it and the end-of-turn text after it are marked (the rule is in `flatcollate.data.spans`)::

    text    <|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n | yo<|im_end|>\\n
    mask     0 ..............................................  0 | 1 ..........  1

What a template writes before and after a reply is learnt once per template from a probe conversation. A template's
`{% generation %}` markers are not needed; `ChatRenderer.generation_mask` returns them to cross-check the offsets.
"""

import logging
from collections.abc import Sequence

import jinja2
import numpy as np

# What apply_chat_template does before rendering (compile, plain data, reasoning aliases), done once per row here.
from transformers.utils.chat_template_utils import (
    _alias_reasoning_fields,
    _compile_jinja_template,
    _plain_template_data,
)

from .messages import check_messages  # noqa: F401 - re-exported, its home before flatcollate.data.messages
from .row_errors import RowError
from .spans import tokens_in_spans
from .turns import generated_spans

logger = logging.getLogger(__name__)

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
_PROBE_USER, _PROBE_REPLY = "flatcollate probe question", "flatcollate probe reply"
_PROBE_FOLLOW_UP, _PROBE_ANSWER = "flatcollate probe follow-up", "flatcollate probe answer"


def sharegpt_to_messages(conversations, *, where: str) -> list[dict]:
    """ShareGPT `[{"from", "value"}]` turns to `[{"role", "content"}]` (`function_call` is an assistant turn and
    `observation` a tool turn).

    >>> sharegpt_to_messages([{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}], where="row 0")
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}]
    """
    if not isinstance(conversations, Sequence) or isinstance(conversations, str):
        raise RowError(
            f"{where} must be a list of {{'from', 'value'}} turns, got {conversations!r:.80}.", reason="bad_message"
        )
    messages = []
    for turn, item in enumerate(conversations):
        if not isinstance(item, dict) or item.get("from") not in SHAREGPT_ROLES or "value" not in item:
            raise RowError(
                f"{where}, turn {turn}: expected {{'from': one of {sorted(SHAREGPT_ROLES)}, 'value': str}}, "
                f"got {item!r:.80}.",
                reason="unknown_role" if isinstance(item, dict) and "value" in item else "bad_message",
            )
        messages.append({"role": SHAREGPT_ROLES[item["from"]], "content": item["value"]})
    return messages


def has_generation_markers(template: str | None) -> bool:
    return template is not None and "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}")


class ChatRenderer:
    """Render conversations with a chat template and mark the tokens of the assistant's replies.

    Args:
        tokenizer (`PreTrainedTokenizerFast`): a fast tokenizer (character offsets are needed) with a chat template,
            or one given by `chat_template`.
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
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(
                f"{type(tokenizer).__name__} is a slow tokenizer; labels are placed by character offsets, which need "
                "a fast one: load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
            )
        self.template_kwargs = dict(template_kwargs or {})
        self.reply_prefix, self.reply_suffix, self.history_header = self._probe()
        self.earlier_end_of_turn = self._probe_earlier_end_of_turn()

    def render(self, messages: list[dict], *, tools=None, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def prefix_renderer(self, messages: list[dict], *, tools=None):
        """`render(messages[:k], add_generation_prompt=...)` as a string, for the prefixes that place the labels.

        The template is compiled once and the conversation made template data once (as `apply_chat_template` does
        on every call), so each prefix costs only its own rendering.
        """
        compiled = _compile_jinja_template(self.chat_template)
        chat = _alias_reasoning_fields(_plain_template_data(list(messages)))
        context = _plain_template_data({**self.tokenizer.special_tokens_map, **self.template_kwargs})
        tool_schemas = _plain_template_data(tools)

        def render(head: list[dict], add_generation_prompt: bool) -> str:
            return compiled.render(
                messages=chat[: len(head)], tools=tool_schemas, documents=None,
                add_generation_prompt=add_generation_prompt, **context,
            )

        return render

    def generated_spans(self, text: str, messages: list[dict], *, tools=None, where: str) -> np.ndarray:
        """The character spans of `text` (the row's render) that the model generates (`turns.generated_spans`)."""
        return generated_spans(
            text,
            messages,
            render=self.prefix_renderer(messages, tools=tools),
            generation_prompt=self.reply_prefix,
            end_of_turn=self.reply_suffix,
            history_header=self.history_header,
            earlier_end_of_turn=self.earlier_end_of_turn,
            where=where,
        )

    def _probe_content(self, text: str):
        """A probe message's content: plain text here; a processor's renderer gives a list of text parts."""
        return text

    def _probe(self) -> tuple[str, str, str | None]:
        """What the template writes right before a reply (its generation prompt), right after one (end of turn), and
        before a reply's text where the reply is history (the part of the generation prompt the history keeps:
        `<｜Assistant｜>` of DeepSeek-R1's `<｜Assistant｜><think>\\n`; None where unknown)."""
        user = {"role": "user", "content": self._probe_content(_PROBE_USER)}
        for head in ([], [{"role": "system", "content": self._probe_content("flatcollate probe system")}]):
            try:
                reply = {"role": "assistant", "content": self._probe_content(_PROBE_REPLY)}
                whole = self.render([*head, user, reply])
                prompt = self.render([*head, user])
                with_header = self.render([*head, user], add_generation_prompt=True)
            except jinja2.TemplateError:
                continue
            suffix = whole[whole.rfind(_PROBE_REPLY) + len(_PROBE_REPLY) :] if _PROBE_REPLY in whole else ""
            prefix = with_header[len(prompt) :] if with_header.startswith(prompt) else ""
            kept = whole.startswith(prompt) and _PROBE_REPLY in whole
            return prefix, suffix, whole[len(prompt) : whole.rfind(_PROBE_REPLY)] if kept else None
        logger.warning(
            "the chat template refused a probe conversation (user, assistant); the end-of-turn text after each reply "
            "is unknown, so only the replies' own tokens are trained."
        )
        return "", "", None

    def _probe_earlier_end_of_turn(self) -> str:
        """What the template writes right after a reply that is not the last one (`<|end|>` where the last one ends
        with `<|return|>`, as gpt-oss has it); "" where unknown.

        In `(head, user, reply, user, reply)` it is what follows the first reply, less the header of the user message
        after it: what the template writes between `render(head)` and the text of a user message that follows it::

            render(head + [user])          <head> | <|start|>user<|message|> | q<|end|>
            after the first reply          a | <|end|> | <|start|>user<|message|> | q2<|end|>...
        """
        user = {"role": "user", "content": self._probe_content(_PROBE_USER)}
        reply = {"role": "assistant", "content": self._probe_content(_PROBE_REPLY)}
        follow_up = {"role": "user", "content": self._probe_content(_PROBE_FOLLOW_UP)}
        answer = {"role": "assistant", "content": self._probe_content(_PROBE_ANSWER)}
        for head in ([], [{"role": "system", "content": self._probe_content("flatcollate probe system")}]):
            conversation = [*head, user, reply, follow_up, answer]
            render = self.prefix_renderer(conversation)  # compiled: it renders `head` alone, even an empty one
            try:
                alone, first, both = render(head, False), render([*head, user], False), render(conversation, False)
            except jinja2.TemplateError:
                continue
            if not first.startswith(alone) or _PROBE_USER not in first or _PROBE_REPLY not in both:
                continue
            user_header = first[len(alone) : first.index(_PROBE_USER)]
            after = both[both.index(_PROBE_REPLY) + len(_PROBE_REPLY) : both.find(_PROBE_FOLLOW_UP)]
            if _PROBE_FOLLOW_UP in both and after.endswith(user_header):
                return after[: len(after) - len(user_header)]
        return ""

    def encode(self, messages: list[dict], *, tools=None, where: str = "messages") -> tuple[list[int], np.ndarray]:
        """Token ids of the whole conversation and a mask of the tokens the assistant writes.

        Args:
            messages (`list[dict]`): checked with `check_messages`, None-valued keys left out (`present_keys`).
            tools (`list`, *optional*): tool definitions passed to the template.
            where (`str`): row and field, for error messages.

        Returns:
            `(input_ids, mask)`: `list[int]` of length `T` (equal to `apply_chat_template(tokenize=True)`) and
            `np.ndarray` of shape `(T,)`, bool.

        Raises:
            `RowError` with reason `template_error`, `template_drops_content` or `nothing_to_train`.
        """
        try:
            text = self.render(messages, tools=tools)
        except jinja2.TemplateError as err:
            message = f"{where}: the chat template rejected the conversation: {err}"
            raise RowError(message, reason="template_error") from err
        spans = self.generated_spans(text, messages, tools=tools, where=where)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = tokens_in_spans(offsets, spans)
        if not mask.any():
            raise RowError(f"{where}: the assistant replies render no tokens.", reason="nothing_to_train")
        return encoding["input_ids"], mask

    def generation_mask(self, messages: list[dict], *, tools=None) -> tuple[list[int], np.ndarray]:
        """The template's own `{% generation %}` mask (`return_assistant_tokens_mask=True`), to cross-check `encode`.

        Returns:
            `(input_ids, mask)`: `apply_chat_template(tokenize=True)` ids, `list[int]` of length `T`, and the mask,
            `np.ndarray` of shape `(T,)`, bool.
        """
        if not has_generation_markers(self.chat_template):
            raise ValueError("the chat template has no {% generation %} markers; pass one that has them.")
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **self.template_kwargs,
        )
        return list(out["input_ids"]), np.asarray(out["assistant_masks"], dtype=bool)
