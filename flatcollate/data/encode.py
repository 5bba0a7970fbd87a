"""One raw example to `input_ids` and `labels`: a pure, picklable encoder for map-style and streaming pipelines.

Formats (`format=`):

- `"instruction"`: `query_field` (+ optional `input_field`) through a prompt template, `resp_field` as the answer;
- `"prompt_completion"`: `prompt_field` and `completion_field` as plain text, or both as lists of messages (TRL's
  conversational prompt/completion: rendered as one conversation, of which the replies in the completion are
  trained);
- `"messages"`: `messages_field` holds `[{"role", "content"}]` (with `tool_calls`, `reasoning_content`, content
  parts: `flatcollate.data.messages`) and `tools_field` an optional tool list, rendered with the chat template;
- `"sharegpt"`: `conversations_field` holds `[{"from", "value"}]` (and `tools_field` an optional JSON tool list);
- `"auto"`: picked per example from the fields present, in the order messages, sharegpt, prompt_completion,
  instruction.

Each example is rendered to one text and tokenized once with character offsets; the tokens overlapping the answer
(the completion, or what the model generates for each assistant message: `flatcollate.data.turns`) are trained, the
others get label -100 (rule and picture in `flatcollate.data.spans`). Text formats end the answer with the EOS token
so the model learns to stop, and start with one BOS where the tokenizer adds one: a prompt that starts with the BOS
text (rendered beforehand with `apply_chat_template(tokenize=False)`) keeps its own, without the tokenizer's.
`train_on_prompt=True` trains every token instead (labels equal `input_ids`), as TRL's `completion_only_loss=False`
and `assistant_only_loss=False` do. A row that cannot be encoded raises `RowError` naming the row, the field and the
fix, or, with `on_error="skip"`, comes back as a `SkippedRow` carrying the reason; so does a row on which the template
or tokenizer raises anything else (reason `encode_error`).
"""

import json
from dataclasses import dataclass, field

import jinja2
import numpy as np

from .._conventions import IGNORE_INDEX
from .chat import ChatRenderer, check_messages, sharegpt_to_messages
from .messages import present_keys
from .prompt_templates import load_template, render_prompt
from .row_errors import RowError, RowTypeError, SkippedRow
from .spans import tokens_in_spans

FORMATS = ("auto", "instruction", "prompt_completion", "messages", "sharegpt")


@dataclass
class Encoder:
    """Callable `encoder(example, index=None) -> {"input_ids": list[int], "labels": list[int]}`; build with
    `build_encoder`. With `on_error="skip"` a row that cannot be encoded gives a `SkippedRow` instead of raising."""

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
    train_on_prompt: bool = False
    on_error: str = "raise"
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
        raise RowError(
            f"{where}: cannot tell the format from fields {sorted(example)}; expected one of "
            f"{self.messages_field!r}, {self.conversations_field!r}, {self.prompt_field!r}+{self.completion_field!r} "
            f"or {self.query_field!r}+{self.resp_field!r} (set format= and the *_field options).",
            reason="unknown_format",
        )

    def _field(self, example: dict, key: str, where: str):
        if key not in example or example[key] is None:
            raise RowError(
                f"{where}: missing field {key!r} (fields: {sorted(example)}); set the matching *_field.",
                reason="missing_field",
            )
        return example[key]

    def _text(self, example: dict, key: str, where: str, *, optional: bool = False) -> str:
        if optional and example.get(key) is None:
            return ""
        value = self._field(example, key, where)
        if not isinstance(value, str):
            raise RowTypeError(f"{where}: field {key!r} must be a string, got {type(value).__name__} {value!r:.60}.")
        if not optional and not value.strip():
            raise RowError(f"{where}: field {key!r} is empty.", reason="empty_field")
        return value

    def _text_pair(self, prompt: str, answer: str) -> dict:
        """Tokenize `prompt + answer` as one text (so merges across the seam are the tokenizer's own) and train the
        tokens overlapping the answer's characters, then EOS. The tokenizer's BOS is left out where the text's own
        BOS follows it (a prompt rendered by a chat template)::

            tokenizer(text)   <bos> (0, 0) | <bos> (0, 17) | <|start_header_id|> ...
            input_ids                      | <bos>         | <|start_header_id|> ...
        """
        text = prompt + answer
        encoding = self.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
        ids = list(encoding["input_ids"])
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[:2] == [bos, bos] and offsets[0, 1] == 0:  # added, zero width, then the text's
            ids, offsets = ids[1:], offsets[1:]
        trained = tokens_in_spans(offsets, np.array([[len(prompt), len(text)]], dtype=np.int64))
        eos = self.tokenizer.eos_token_id
        if self.add_eos and eos is not None:
            if ids and ids[-1] == eos:
                trained[-1] = True  # the post-processor's own EOS, at zero width
            else:
                ids.append(eos)
                trained = np.append(trained, True)
        labels = np.where(trained | self.train_on_prompt, np.asarray(ids, dtype=np.int64), IGNORE_INDEX)
        return {"input_ids": ids, "labels": labels.tolist()}

    def _chat(self, messages: list[dict], tools, where: str, *, prompt_messages: int = 0) -> dict:
        """Encode a conversation, training what the model generates for the assistant messages from index
        `prompt_messages` on (the messages before it are the prompt of a conversational prompt/completion row)."""
        if self.chat is None:
            raise RowError(
                f"{where} is a conversation but the tokenizer has no chat template; pass chat_template=... to "
                "build_encoder.",
                reason="no_chat_template",
            )
        messages = check_messages(present_keys(messages), where=where)
        if prompt_messages:
            ids, mask = self._completion_replies(messages, prompt_messages, tools, where)
        else:
            ids, mask = self.chat.encode(messages, tools=tools, where=where)
        labels = np.where(mask | self.train_on_prompt, np.asarray(ids, dtype=np.int64), IGNORE_INDEX)
        return {"input_ids": list(ids), "labels": labels.tolist()}

    def _completion_replies(self, messages: list[dict], first: int, tools, where: str) -> tuple[list[int], np.ndarray]:
        """`ChatRenderer.encode` training only the replies at message index `first` and later.

        Returns:
            `(input_ids, mask)`: `list[int]` of length `T` (`apply_chat_template(tokenize=True)`) and `(T,)` bool.
        """
        try:
            text = self.chat.render(messages, tools=tools)
        except jinja2.TemplateError as err:
            message = f"{where}: the chat template rejected the conversation: {err}"
            raise RowError(message, reason="template_error") from err
        spans = self.chat.generated_spans(text, messages, tools=tools, where=where)  # one per assistant message
        replies = np.flatnonzero([message["role"] == "assistant" for message in messages])
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = tokens_in_spans(offsets, spans[replies >= first])
        if not mask.any():
            raise RowError(f"{where}: the completion's replies render no tokens.", reason="nothing_to_train")
        return encoding["input_ids"], mask

    def _chat_prompt_completion(self, example: dict, prompt: list, where: str) -> dict:
        """TRL's conversational prompt/completion row: `prompt + completion` rendered as one conversation, whose
        replies in `completion` are trained (those in `prompt` are context, as TRL's `completion_only_loss` has it)."""
        key = self.completion_field
        completion = self._field(example, key, where)
        if not isinstance(completion, list):
            raise RowTypeError(
                f"{where}: field {self.prompt_field!r} is a list of messages, so field {key!r} must be one too, got "
                f"{type(completion).__name__} {completion!r:.60}."
            )
        if not completion:
            raise RowError(f"{where}: field {key!r} is empty.", reason="empty_field")
        at = f"{where}: fields {self.prompt_field!r} + {key!r}"
        return self._chat([*prompt, *completion], self._tools(example, where), at, prompt_messages=len(prompt))

    def extra_features(self) -> dict:
        """Dataset features of the fields the encoder returns besides `input_ids` and `labels`: none for text rows (an
        image-text encoder adds its per-token and vision fields)."""
        return {}

    def files_key(self, dataset) -> str | None:
        """A key of the files the rows refer to by path, whose content a dataset's fingerprint does not see; None for
        text rows (an image-text encoder keys its image files). Part of `make_supervised_dataset`'s cache key."""
        return None

    def encode(self, example: dict, index: int | None = None) -> dict:
        """Like calling the encoder, but always raises for a bad row: `RowError`, or what the template or tokenizer
        raised."""
        where = f"row {index}" if index is not None else "example"
        if not isinstance(example, dict):
            message = f"{where}: expected a dict of fields, got {type(example).__name__}."
            raise RowTypeError(message, reason="not_a_dict")
        fmt = self._format_of(example, where)
        if fmt == "instruction":
            query = self._text(example, self.query_field, where)
            input_text = self._text(example, self.input_field, where, optional=True)
            prompt = render_prompt(self.template, query, input_text)
            return self._text_pair(prompt, self._text(example, self.resp_field, where))
        if fmt == "prompt_completion":
            if isinstance(self._field(example, self.prompt_field, where), list):
                return self._chat_prompt_completion(example, example[self.prompt_field], where)
            prompt = self._text(example, self.prompt_field, where)
            return self._text_pair(prompt, self._text(example, self.completion_field, where))
        if fmt == "messages":
            key = self.messages_field
            return self._chat(self._field(example, key, where), self._tools(example, where), f"{where}: field {key!r}")
        key = self.conversations_field
        messages = sharegpt_to_messages(self._field(example, key, where), where=f"{where}: field {key!r}")
        return self._chat(messages, self._tools(example, where), f"{where}: field {key!r}")

    def _tools(self, example: dict, where: str) -> list | None:
        """The row's tool definitions (`tools_field`, a list or its JSON text), passed to the template."""
        tools = example.get(self.tools_field) or None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as err:
                raise RowError(
                    f"{where}: field {self.tools_field!r} is not valid JSON ({err}).", reason="wrong_type"
                ) from err
        if tools is not None and not isinstance(tools, list):
            raise RowError(
                f"{where}: field {self.tools_field!r} must be a list of tool definitions (or its JSON text), got "
                f"{type(tools).__name__}.",
                reason="wrong_type",
            )
        return tools

    def __call__(self, example: dict, index: int | None = None) -> dict | SkippedRow:
        try:
            return self._encode_row(example, index)
        except RowError as err:
            if self.on_error == "raise":
                raise
            return SkippedRow(index, err.reason, str(err))

    def _encode_row(self, example: dict, index: int | None) -> dict:
        """`encode`, with any other error raised on the row (a template's `TypeError` on a value it does not expect)
        raised as the row's `RowError`, naming it."""
        try:
            return self.encode(example, index)
        except RowError:
            raise
        except Exception as err:
            where = f"row {index}" if index is not None else "example"
            raise RowError(
                f'{where}: encoding it raised {type(err).__name__}: {err}. Fix the row, or pass on_error="skip" to '
                "count and skip such rows.",
                reason="encode_error",
            ) from err
