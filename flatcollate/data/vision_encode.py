"""Conversations with images to the features a vision-language model trains on, through the model's processor.

A row holds `messages` whose contents are text or lists of parts (TRL's and transformers' format) and `images`, one
per `{"type": "image"}` part, in order (PIL images, paths or `datasets.Image` values, see `flatcollate.data.images`)::

    {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
     "images": ["cat.png"]}

Each row is rendered once with `processor.apply_chat_template(tokenize=False)` and given to the processor once,
`processor(text=[rendered], images=[images])`, which expands every image placeholder (Qwen2-VL: one `<|image_pad|>`
per merged patch) and tokenizes the expanded text with character offsets. The replies' spans are found in the rendered
text by the text path's rule (`flatcollate.data.spans.reply_spans`) and moved into the expanded text by the places the
processor reports for its replacements (`return_text_replacement_offsets`), then `tokens_in_spans` marks the tokens::

    rendered  user: <|image_pad|> hi  assistant: | yo<|im_end|>\\n |
    expanded  user: <|image_pad|><|image_pad|><|image_pad|><|image_pad|> hi  assistant: | yo<|im_end|>\\n |
    labels    -100 ...................................................................  | yo <|im_end|> \\n |

Tokens overlapping an expanded placeholder are never trained. `input_ids` are exactly
`processor(text=processor.apply_chat_template(messages), images=images)["input_ids"][0]` (without the tokenizer's
own special tokens where the template writes BOS itself, as `apply_chat_template(tokenize=True)` does).
"""

from dataclasses import dataclass, field

import datasets
import jinja2
import numpy as np
import PIL.Image

from .._conventions import IGNORE_INDEX
from .chat import ChatRenderer, check_messages
from .encode import Encoder
from .fingerprint import image_files_fingerprint
from .images import as_image_list, image_paths, load_images
from .messages import present_keys
from .processor_text import expand_spans, move_spans, prefix_token_types, processor_text
from .row_errors import RowError
from .spans import reply_spans, tokens_in_spans
from .videos import check_video_slot, row_videos, video_parts

TOKEN_FIELDS = ("mm_token_type_ids", "token_type_ids")
"""Processor outputs with one value per token, kept as 1-D lists beside `input_ids` and `labels`."""
_DROPPED = ("input_ids", "labels", "attention_mask", "offset_mapping", "text_replacement_offsets")
"""Processor outputs the encoder replaces (`input_ids`, `labels`: PaliGemma's are all -100 without `suffix=`) or uses
only to place the replies."""


class ProcessorChatRenderer(ChatRenderer):
    """A `ChatRenderer` that renders with `processor.apply_chat_template` and probes the template with text parts.

    Args:
        processor (`ProcessorMixin`): with a fast tokenizer and a chat template (or `chat_template`).
        chat_template (`str`, *optional*), template_kwargs (`dict`, *optional*): as for `ChatRenderer`.
    """

    def __init__(self, processor, *, chat_template: str | None = None, template_kwargs: dict | None = None):
        self.processor = processor
        template = chat_template or processor.chat_template
        if not template:
            raise ValueError(
                f"{type(processor).__name__} has no chat template; pass chat_template=... to build_encoder: a Jinja "
                f"template that writes the processor's image placeholder {processor.image_token!r} for each "
                "{'type': 'image'} part."
            )
        try:
            super().__init__(processor.tokenizer, chat_template=template, template_kwargs=template_kwargs)
        except (TypeError, jinja2.TemplateError) as err:  # the probe's content is a list of parts, not a string
            source = "the chat_template passed" if chat_template else f"{type(processor).__name__}.chat_template"
            raise ValueError(
                f"{source} cannot render messages whose content is a list of parts ({type(err).__name__}: {err}); it "
                "is likely a text model's template, which joins `message['content']` as a string. Pass "
                "chat_template=... to build_encoder (or make_supervised_dataset): a template that loops over each "
                f"message's parts and writes the processor's image placeholder {processor.image_token!r} for each "
                "{'type': 'image'} part, such as the image-text model's own (`AutoProcessor.from_pretrained(<the "
                "image-text model>).chat_template`); docs/vision.md shows a minimal one."
            ) from err

    def _probe_content(self, text: str):
        return [{"type": "text", "text": text}]

    def render(self, messages: list[dict], *, tools=None, add_generation_prompt: bool = False) -> str:
        return self.processor.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )


def text_views(messages, *, where: str) -> tuple[list[dict], list[dict], int]:
    """The text of a conversation with image parts, as the text path's span search takes it.

    Returns:
        `(views, pieces, num_images)`: `views` has one `{"role", "content": str}` per message (its text parts
        joined), for `check_messages`; `pieces` is what `reply_spans` searches in order: an assistant message as
        its joined text (a reply's span runs over all of it), any other message as one piece per non-empty text part
        (the template writes image markup between them); `num_images` counts the `{"type": "image"}` parts
        (`{"type": "video"}` parts are read by `flatcollate.data.videos`).

    Raises:
        `RowError`: reason `bad_message` (not a message, or a part that is not text, image or video) or
        `image_in_reply` (an image or video in a reply).

    >>> views, pieces, n = text_views([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
    ...                                {"role": "assistant", "content": "yo"}], where="row 0")
    >>> views[0], pieces, n
    ({'role': 'user', 'content': 'hi'}, [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}], 1)
    """
    if not isinstance(messages, list | tuple):
        return messages, messages, 0  # check_messages names the problem
    views, pieces, num_images = [], [], 0
    for turn, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list | tuple):
            views.append(message)  # text or malformed: check_messages takes it from here
            pieces.append(message)
            continue
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "video"):
                if message.get("role") == "assistant":
                    article = "an" if kind == "image" else "a"
                    raise RowError(
                        f"{where}, message {turn} (assistant), part {k}: {article} {kind} in a reply; the model does "
                        f"not write {kind}s, so move it into the user turn before, or pass on_error='skip'.",
                        reason="image_in_reply",
                    )
                num_images += kind == "image"
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise RowError(
                    f"{where}, message {turn}, part {k}: expected {{'type': 'text', 'text': str}}, "
                    f"{{'type': 'image'}} or {{'type': 'video'}}, got {part!r:.80}.",
                    reason="bad_message",
                )
        views.append({"role": message.get("role"), "content": "".join(texts)})
        if message.get("role") == "assistant":
            pieces.append(views[-1])
        else:
            pieces.extend({"role": message.get("role"), "content": t} for t in texts if t)
    return views, pieces, num_images


@dataclass
class VisionEncoder(Encoder):
    """An `Encoder` whose `"messages"` rows may hold images, encoded by a processor; built by
    `build_encoder(processor)`.

    `encoder(example, index=None)` returns `input_ids` and `labels` (`list[int]`, length `T`), the processor's
    per-token fields (`TOKEN_FIELDS`, `list[int]` of length `T`), and its vision fields as it returns them for a batch
    of one row, as numpy arrays (Qwen2-VL: `pixel_values` `(patches, 1176)` float32, `image_grid_thw` `(images, 3)`
    int64); a row without images has no vision fields. Rows of the text formats are encoded as `Encoder` does.
    """

    processor: object = None
    images_field: str = "images"
    videos_field: str = "videos"
    processor_kwargs: dict = field(default_factory=dict)

    def encode(self, example: dict, index: int | None = None) -> dict:
        where = f"row {index}" if index is not None else "example"
        if not isinstance(example, dict) or self._format_of(example, where) != "messages":
            if isinstance(example, dict) and as_image_list(example.get(self.images_field)):
                raise RowError(
                    f"{where}: field {self.images_field!r} holds images but the row is not a 'messages' "
                    "conversation, where {'type': 'image'} parts place them; set format= and messages_field=.",
                    reason="unknown_format",
                )
            return super().encode(example, index)
        if self.chat is None:
            raise RowError(
                f"{where} is a conversation but the processor has no chat template; pass chat_template=... to "
                "build_encoder.",
                reason="no_chat_template",
            )
        return self._with_images(self._field(example, self.messages_field, where), example, where)

    def _with_images(self, messages, example: dict, where: str) -> dict:
        at = f"{where}: field {self.messages_field!r}"
        messages = present_keys(messages)
        views, pieces, num_parts = text_views(messages, where=at)
        check_messages(views, where=at)
        images = as_image_list(example.get(self.images_field))
        if num_parts != len(images):
            raise RowError(
                f"{where}: {num_parts} {{'type': 'image'}} parts in field {self.messages_field!r} but {len(images)} "
                f"images in field {self.images_field!r}; give one image per image part, in order, or pass "
                "on_error='skip'.",
                reason="image_count",
            )
        try:
            text = self.chat.render(messages)
        except jinja2.TemplateError as err:
            raise RowError(
                f"{at}: the chat template rejected the conversation: {err}", reason="template_error"
            ) from err
        videos, listed = [], as_image_list(example.get(self.videos_field))
        if video_parts(messages) or listed:
            check_video_slot(self.processor, where=at)
            fields = {"messages_field": self.messages_field, "videos_field": self.videos_field}
            videos = row_videos(messages, listed, where=where, **fields)
        for kind, token, count in (
            ("image", self.processor.image_token, num_parts),
            ("video", getattr(self.processor, "video_token", None), len(videos)),
        ):
            if token is not None and text.count(token) != count:
                raise RowError(
                    f"{at}: the chat template writes {text.count(token)} {kind} placeholders {token!r} for {count} "
                    f"{kind} parts; use a chat_template that writes one per {{'type': '{kind}'}} part (and no text "
                    "part that holds the placeholder itself).",
                    reason="template_drops_content",
                )
        spans = reply_spans(
            text, pieces, reply_prefix=self.chat.reply_prefix, reply_suffix=self.chat.reply_suffix, where=at
        )
        loaded = load_images(images, where=f"{where}: field {self.images_field!r}")
        out = self._process(text, loaded, videos, where)
        spans = move_spans(spans, text, processor_text(self.processor, text, loaded), where=at)
        ids = np.asarray(out["input_ids"][0], dtype=np.int64)
        offsets = np.asarray(out["offset_mapping"][0], dtype=np.int64).reshape(-1, 2)
        replaced = out.get("text_replacement_offsets")
        replaced = [] if replaced is None or len(replaced) == 0 else list(replaced[0])  # InternVL: an empty array
        expanded = np.array([r["new_span"] for r in replaced], dtype=np.int64).reshape(-1, 2)
        trained = tokens_in_spans(offsets, expand_spans(spans, replaced)) & ~tokens_in_spans(offsets, expanded)
        if not trained.any():
            raise RowError(f"{at}: the assistant replies render no tokens.", reason="nothing_to_train")
        row = {"input_ids": ids.tolist(), "labels": np.where(trained, ids, IGNORE_INDEX).tolist()}
        for key, value in out.items():
            if key not in _DROPPED:
                row[key] = np.asarray(value[0]).tolist() if key in TOKEN_FIELDS else value
        if "labels" in out and "token_type_ids" in out:  # the processor's types mark its trained suffix (PaliGemma)
            row["token_type_ids"] = prefix_token_types(trained).tolist()
        return row

    def _process(self, text: str, images: list[PIL.Image.Image], videos: list[np.ndarray], where: str):
        bos = self.tokenizer.bos_token
        options = {
            "add_special_tokens": not (bos and text.startswith(bos)),
            **self.processor_kwargs,
            "return_offsets_mapping": True,
            "return_text_replacement_offsets": True,
            "return_tensors": "np",
        }
        try:
            if videos:  # only then: a processor without its video slot refuses `videos=` even when None
                options["videos"] = videos
            return self.processor(text=[text], images=[images] if images else None, **options)
        except ValueError as err:  # e.g. an image too narrow for the processor's patch grid
            raise RowError(f"{where}: the processor refused the row: {err}", reason="processor_error") from err

    def files_key(self, dataset: datasets.Dataset) -> str | None:
        """The content of the image files the rows refer to by path (the dataset's fingerprint has only the paths)."""
        if self.images_field not in dataset.column_names:
            return None
        return image_files_fingerprint(image_paths(dataset.data.column(self.images_field)))

    def extra_features(self) -> datasets.Features:
        """Column types of the outputs beyond `input_ids` and `labels`, for `datasets.map`: per-token fields as lists
        of int64, vision fields as nested lists of their dtype (one level per array dimension), from one probe call
        of the processor on a blank 64x64 image, and a blank 4-frame video where it has a video processor (rows
        without a video store None there)."""
        probe = PIL.Image.new("RGB", (64, 64))
        options = {**self.processor_kwargs, "return_tensors": "np"}
        text = f"probe {self.processor.image_token}"
        if getattr(self.processor, "video_processor", None) is not None:
            text, options["videos"] = f"{text} {self.processor.video_token}", [np.zeros((4, 64, 64, 3), np.uint8)]
        out = self.processor(text=[text], images=[[probe]], **options)
        features = {}
        for key, value in out.items():
            if key in _DROPPED:
                continue
            array = np.asarray(value[0]) if key in TOKEN_FIELDS else np.asarray(value)
            feature = datasets.Value(array.dtype.name)
            for _ in range(array.ndim):
                feature = datasets.List(feature)
            features[key] = feature
        return datasets.Features(features)
