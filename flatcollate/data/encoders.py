"""`build_encoder`: the encoder for a tokenizer (text rows, `flatcollate.data.encode`) or for a processor with an
image processor (image-text rows, `flatcollate.data.vision_encode`), with every option checked once."""

import difflib

from transformers import PreTrainedTokenizerBase, ProcessorMixin

from .chat import ChatRenderer
from .encode import FORMATS, Encoder
from .prompt_templates import load_template
from .row_errors import check_on_error
from .vision_encode import ProcessorChatRenderer, VisionEncoder


def build_encoder(
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    *,
    format: str = "auto",
    template: str | dict = "alpaca",
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    add_eos: bool = True,
    train_on_prompt: bool = False,
    on_error: str = "raise",
    processor_kwargs: dict | None = None,
    **fields: str,
) -> Encoder:
    """A picklable per-example encoder.

    Every format renders the whole example to one text, tokenizes it once with character offsets, and trains the
    tokens that overlap the answer (see `flatcollate.data.spans` for the rule), so `input_ids` are the tokenization
    of the whole text: exactly `apply_chat_template(tokenize=True)` for conversations.

    Args:
        tokenizer (`PreTrainedTokenizerFast` or `ProcessorMixin`): fast (character offsets are needed). A processor
            with an image processor gives a `VisionEncoder`: `"messages"` rows may then hold images
            (`flatcollate.data.vision_encode`).
        format (`str`, *optional*, defaults to `"auto"`): one of `"auto"`, `"instruction"`, `"prompt_completion"`
            (text, or TRL's conversational prompt/completion: both fields lists of messages), `"messages"`,
            `"sharegpt"`.
        template (`str` or `dict`, *optional*, defaults to `"alpaca"`): prompt template for `"instruction"` rows (see
            `flatcollate.data.prompt_templates`).
        chat_template (`str`, *optional*): Jinja chat template replacing the tokenizer's.
        chat_template_kwargs (`dict`, *optional*): extra template variables, e.g. `{"date_string": "26 Jul 2024"}`.
        add_eos (`bool`, *optional*, defaults to `True`): end text answers with the EOS token (trained on).
        train_on_prompt (`bool`, *optional*, defaults to `False`): train every token, the prompt's too (labels equal
            `input_ids`): TRL's `completion_only_loss=False` for prompt/completion rows, `assistant_only_loss=False`
            for conversations. Rows are checked as without it. Refused with a processor (it would train image
            placeholder tokens).
        on_error (`str`, *optional*, defaults to `"raise"`): `"raise"` a `RowError` for a row that cannot be
            encoded, or `"skip"`: return a `SkippedRow(index, reason, message)` for it.
        processor_kwargs (`dict`, *optional*): with a processor, extra arguments of its call, e.g.
            `{"size": {"shortest_edge": 56 * 56, "longest_edge": 512 * 28 * 28}}` for Qwen2-VL.
        **fields: `query_field`, `resp_field`, `input_field`, `prompt_field`, `completion_field`, `messages_field`,
            `conversations_field`, `tools_field`, and with a processor `images_field`.

    Returns:
        `Encoder`: `encoder(example, index=None)` -> `{"input_ids": list[int], "labels": list[int]}` or `SkippedRow`.
    """
    processor, cls, chat_class = None, Encoder, ChatRenderer
    if getattr(tokenizer, "image_processor", None) is not None:
        processor, tokenizer, cls, chat_class = tokenizer, tokenizer.tokenizer, VisionEncoder, ProcessorChatRenderer
    elif processor_kwargs is not None:
        raise TypeError(f"processor_kwargs= applies to a processor, not to a {type(tokenizer).__name__}.")
    if processor is not None and train_on_prompt:
        raise ValueError(
            "train_on_prompt=True would train the image placeholder tokens of image-text rows; pass the processor's "
            "tokenizer for text rows, or leave train_on_prompt=False."
        )
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {FORMATS}.")
    check_on_error(on_error)
    field_options = sorted(f for f in cls.__dataclass_fields__ if f.endswith("_field"))
    unknown = set(fields) - set(field_options)
    if unknown:
        options = ["format", "template", "chat_template", "chat_template_kwargs", "add_eos", "train_on_prompt"]
        close = {name: difflib.get_close_matches(name, options + field_options, n=1) for name in sorted(unknown)}
        close |= {name: ["template"] for name in unknown if name == "prompt_template"}  # DART-Math's name
        hints = "".join(f" Did you mean {match[0]}= for {name}=?" for name, match in close.items() if match)
        raise TypeError(
            f"unknown options {sorted(unknown)}; the options are {', '.join(options)} and the field options "
            f"{', '.join(field_options)}.{hints}"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"{type(tokenizer).__name__} is a slow tokenizer; labels are placed by character offsets, which need a "
            "fast one: load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    renders = tokenizer if processor is None else processor  # whose chat template renders the conversations
    has_template = bool(chat_template or renders.chat_template)  # prompt/completion rows may be conversations
    needs_chat = format in ("messages", "sharegpt") or (format in ("auto", "prompt_completion") and has_template)
    chat = None
    if needs_chat:
        chat = chat_class(renders, chat_template=chat_template, template_kwargs=chat_template_kwargs)
    extra = {} if processor is None else {"processor": processor, "processor_kwargs": dict(processor_kwargs or {})}
    return cls(
        tokenizer,
        format=format,
        template=load_template(template),
        add_eos=add_eos,
        train_on_prompt=train_on_prompt,
        on_error=on_error,
        chat=chat,
        **extra,
        **fields,
    )
