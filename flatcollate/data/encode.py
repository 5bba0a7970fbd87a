"""One raw example to `input_ids` and `labels`: a pure, picklable encoder for map-style and streaming pipelines.

Formats (`format=`):

- `"instruction"`: `query_field` (+ optional `input_field`) through a prompt template, `resp_field` as the answer;
- `"prompt_completion"`: `prompt_field` and `completion_field` as plain text;
- `"messages"`: `messages_field` holds `[{"role", "content"}]`, rendered with the chat template;
- `"sharegpt"`: `conversations_field` holds `[{"from", "value"}]` (and `tools_field` an optional JSON tool list);
- `"auto"`: picked per example from the fields present, in the order messages, sharegpt, prompt_completion,
  instruction.

Prompt tokens get label -100. Text formats end the answer with the EOS token so the model learns to stop; chat formats
train on the assistant's tokens including its end-of-turn token.
"""

import json
from dataclasses import dataclass, field

import numpy as np

from .._conventions import IGNORE_INDEX
from .chat import ChatRenderer, check_messages, sharegpt_to_messages
from .prompt_templates import load_template, render_prompt

FORMATS = ("auto", "instruction", "prompt_completion", "messages", "sharegpt")


@dataclass
class Encoder:
    """Callable `encoder(example, index=None) -> {"input_ids": list[int], "labels": list[int]}`; build with
    `build_encoder`."""

    tokenizer: object
    format: str = "auto"
    template: dict = field(default_factory=lambda: load_template("alpaca"))
    query_field: str = "query"
    resp_field: str = "response"
    input_field: str = "input"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    conversations_field: str = "conversations"
    tools_field: str = "tools"
    add_eos: bool = True
    chat: ChatRenderer | None = None

    def _format_of(self, example: dict, where: str) -> str:
        if self.format != "auto":
            return self.format
        for name, key in (
            ("messages", self.messages_field),
            ("sharegpt", self.conversations_field),
            ("prompt_completion", self.completion_field),
            ("instruction", self.resp_field),
        ):
            if key in example:
                return name
        raise ValueError(
            f"{where}: cannot tell the format from fields {sorted(example)}; expected one of "
            f"{self.messages_field!r}, {self.conversations_field!r}, {self.prompt_field!r}+{self.completion_field!r} "
            f"or {self.query_field!r}+{self.resp_field!r} (set format= and the *_field options)."
        )

    def _text(self, example: dict, key: str, where: str, *, optional: bool = False) -> str:
        if key not in example or example[key] is None:
            if optional:
                return ""
            raise ValueError(f"{where}: missing field {key!r} (fields: {sorted(example)}); set the matching *_field.")
        value = example[key]
        if not isinstance(value, str):
            raise TypeError(f"{where}: field {key!r} must be a string, got {type(value).__name__} {value!r:.60}.")
        if not optional and not value.strip():
            raise ValueError(f"{where}: field {key!r} is empty.")
        return value

    def _text_pair(self, prompt: str, answer: str) -> dict:
        prompt_ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        answer_ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        if self.add_eos and eos is not None and (not answer_ids or answer_ids[-1] != eos):
            answer_ids = [*answer_ids, eos]
        return {"input_ids": prompt_ids + answer_ids, "labels": [IGNORE_INDEX] * len(prompt_ids) + answer_ids}

    def _chat(self, messages: list[dict], tools, index: int | None, key: str) -> dict:
        if self.chat is None:
            raise ValueError(
                f"row {index}: field {key!r} is a conversation but the tokenizer has no chat template; pass "
                "chat_template=... to build_encoder."
            )
        messages = check_messages(messages, index=index, field=key)
        ids, mask = self.chat.encode(messages, tools=tools, index=index, field=key)
        labels = np.where(mask.astype(bool), np.asarray(ids, dtype=np.int64), IGNORE_INDEX)
        return {"input_ids": list(ids), "labels": labels.tolist()}

    def __call__(self, example: dict, index: int | None = None) -> dict:
        where = f"row {index}" if index is not None else "example"
        if not isinstance(example, dict):
            raise TypeError(f"{where}: expected a dict of fields, got {type(example).__name__}.")
        fmt = self._format_of(example, where)
        if fmt == "instruction":
            query = self._text(example, self.query_field, where)
            input_text = self._text(example, self.input_field, where, optional=True)
            prompt = render_prompt(self.template, query, input_text)
            return self._text_pair(prompt, self._text(example, self.resp_field, where))
        if fmt == "prompt_completion":
            prompt = self._text(example, self.prompt_field, where)
            return self._text_pair(prompt, self._text(example, self.completion_field, where))
        if fmt == "messages":
            if self.messages_field not in example:
                raise ValueError(f"{where}: missing field {self.messages_field!r} (fields: {sorted(example)}).")
            return self._chat(example[self.messages_field], None, index, self.messages_field)
        if self.conversations_field not in example:
            raise ValueError(f"{where}: missing field {self.conversations_field!r} (fields: {sorted(example)}).")
        messages = sharegpt_to_messages(example[self.conversations_field], index=index, field=self.conversations_field)
        tools = example.get(self.tools_field) or None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: field {self.tools_field!r} is not valid JSON ({err}).") from err
        return self._chat(messages, tools, index, self.conversations_field)


def build_encoder(
    tokenizer,
    *,
    format: str = "auto",
    template: str | dict = "alpaca",
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    add_eos: bool = True,
    **fields: str,
) -> Encoder:
    """A picklable per-example encoder.

    Args:
        tokenizer (`PreTrainedTokenizerBase`).
        format (`str`, *optional*, defaults to `"auto"`): one of `"auto"`, `"instruction"`, `"prompt_completion"`,
            `"messages"`, `"sharegpt"`.
        template (`str` or `dict`, *optional*, defaults to `"alpaca"`): prompt template for `"instruction"` rows (see
            `flatcollate.data.prompt_templates`).
        chat_template (`str`, *optional*): Jinja chat template replacing the tokenizer's; one with
            `{% generation %}` markers gives the assistant mask directly.
        chat_template_kwargs (`dict`, *optional*): extra template variables, e.g. `{"date_string": "26 Jul 2024"}`.
        add_eos (`bool`, *optional*, defaults to `True`): end text answers with the EOS token (trained on).
        **fields: `query_field`, `resp_field`, `input_field`, `prompt_field`, `completion_field`, `messages_field`,
            `conversations_field`, `tools_field`.

    Returns:
        `Encoder`: `encoder(example, index=None)` -> `{"input_ids": list[int], "labels": list[int]}`.
    """
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {FORMATS}.")
    unknown = set(fields) - {f for f in Encoder.__dataclass_fields__ if f.endswith("_field")}
    if unknown:
        raise TypeError(f"unknown options {sorted(unknown)}; field options end in '_field'.")
    needs_chat = format in ("messages", "sharegpt") or (format == "auto" and (chat_template or tokenizer.chat_template))
    chat = None
    if needs_chat:
        chat = ChatRenderer(tokenizer, chat_template=chat_template, template_kwargs=chat_template_kwargs)
    return Encoder(
        tokenizer,
        format=format,
        template=load_template(template),
        add_eos=add_eos,
        chat=chat,
        **fields,
    )
