"""The videos of one row as frames arrays, for the family's video processor (Qwen2/2.5/3-VL, LLaVA-OneVision, ...).

A `{"type": "video"}` part of a user message holds its video in the part (`{"type": "video", "video": frames}`, as
transformers' chat templates take it) or, without one, takes the next of the row's `videos` field, in order. A
video is its frames, already decoded and sampled:

- an array or tensor `(frames, height, width, 3)` (or `(frames, 3, height, width)`), uint8 (or integers in 0..255,
  as nested lists read back from a `datasets` column);
- a list of frames, each a PIL image, an image path, a `{"bytes", "path"}` dict (`flatcollate.data.images`) or an
  array `(height, width, 3)`.

Every video becomes one `(frames, height, width, 3)` uint8 array. A video file path is refused: decoding needs a
video backend and a choice of frames (decode and sample the frames first).
"""

import os

import numpy as np
import PIL.Image

from .images import load_image
from .row_errors import RowError, RowTypeError

TORCHVISION_FIX = (
    "install torchvision, the build made for the installed torch (pip install 'flatcollate[vision]'), and build the "
    "processor with its video processor (AutoProcessor.from_pretrained, or flatcollate.vision.load_processor)"
)


def video_parts(messages) -> list[tuple[int, int, object]]:
    """`(message, part, value)` of every `{"type": "video"}` part, in order; `value` is the part's `"video"` (None
    where it holds none). Anything that is not a list of messages with part lists gives none."""
    found = []
    for turn, message in enumerate(messages if isinstance(messages, list | tuple) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for k, part in enumerate(content if isinstance(content, list | tuple) else []):
            if isinstance(part, dict) and part.get("type") == "video":
                found.append((turn, k, part.get("video")))
    return found


def row_videos(messages, listed: list, *, where: str, messages_field: str, videos_field: str) -> list[np.ndarray]:
    """The row's videos in the order of their parts: each part's own, else the next of `listed` (the row's
    `videos_field`, as a list).

    Raises:
        `RowError` (reason `video_count`) when the parts without a video and the field's videos differ in number,
        and what `load_video` raises.
    """
    parts = video_parts(messages)
    wanted = sum(value is None for *_, value in parts)
    if wanted != len(listed):
        raise RowError(
            f"{where}: {wanted} {{'type': 'video'}} parts in field {messages_field!r} hold no frames but "
            f"{len(listed)} videos in field {videos_field!r}; give each video part its frames ({{'type': 'video', "
            f"'video': frames}}) or one video in {videos_field!r} per such part, in order, or pass on_error='skip'.",
            reason="video_count",
        )
    pending, videos = iter(listed), []
    for turn, k, value in parts:
        at = f"{where}: field {messages_field!r}, message {turn}, part {k}"
        if value is None:
            value, at = next(pending), f"{where}: field {videos_field!r}, video {len(videos)}"
        videos.append(load_video(value, where=at))
    return videos


def load_video(value, *, where: str) -> np.ndarray:
    """One video as `(frames, height, width, 3)` uint8 (see the module docstring for what it may be).

    Raises:
        `RowError` (reason `bad_video`): a file path, a shape that is not frames of RGB pixels, frames of different
        sizes, values outside 0..255; `RowTypeError` for a value that is none of these.

    >>> load_video([PIL.Image.new("L", (4, 2))] * 3, where="row 0").shape
    (3, 2, 4, 3)
    >>> load_video(np.zeros((2, 3, 5, 6), dtype=np.uint8), where="row 0").shape  # channels first
    (2, 5, 6, 3)
    """
    if isinstance(value, str | os.PathLike):
        raise RowError(
            f"{where}: a video file path ({str(value)!r:.80}); decode its frames first (sampled as the model was "
            "trained, e.g. with torchvision.io or PyAV) and give them as an array (frames, height, width, 3) or a "
            "list of frame images, or pass on_error='skip'.",
            reason="bad_video",
        )
    if isinstance(value, list | tuple) and value:  # frames, one at a time: images, arrays or nested lists
        frames = [_frame(frame, where=f"{where}, frame {i}") for i, frame in enumerate(value)]
        shapes = [frame.shape for frame in frames]
        if len(set(shapes)) > 1:
            i = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
            raise RowError(
                f"{where}: frame {i} has shape {shapes[i]} but frame 0 has {shapes[0]}; give every frame of a video "
                "one size, or pass on_error='skip'.",
                reason="bad_video",
            )
        value = np.stack(frames)
    array = _frame(value, where=where)
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise RowTypeError(
            f"{where}: a video of {type(value).__name__} ({array.dtype}); expected frames: an array (frames, height, "
            "width, 3) or a list of frame images.",
            reason="bad_video",
        )
    if array.ndim == 4 and array.shape[1] == 3 and array.shape[-1] != 3:
        array = array.transpose(0, 2, 3, 1)  # channels first
    if array.ndim != 4 or array.shape[-1] != 3 or array.shape[0] == 0:
        raise RowError(
            f"{where}: a video of shape {array.shape}; expected frames (frames, height, width, 3), at least one (a "
            "single image goes in an {'type': 'image'} part), or pass on_error='skip'.",
            reason="bad_video",
        )
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() > 255:
            raise RowError(
                f"{where}: video values of {array.dtype} in [{array.min()}, {array.max()}]; give uint8 pixels "
                "(0..255), or pass on_error='skip'.",
                reason="bad_video",
            )
        array = array.astype(np.uint8)
    return array


def _frame(value, *, where: str) -> np.ndarray:
    """An image (`load_image`) as `(height, width, 3)` uint8, or anything else as an array."""
    if isinstance(value, PIL.Image.Image | str | os.PathLike | dict):
        return np.asarray(load_image(value, where=where))
    try:
        return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
    except ValueError as err:  # ragged nested lists
        raise RowError(
            f"{where}: the frames differ in shape ({err}); give every frame one size, or pass on_error='skip'.",
            reason="bad_video",
        ) from err


def check_video_slot(processor, *, where: str) -> None:
    """Raise `RowError` (reason `no_video_processor`) when `processor` cannot encode a row's videos: its class takes
    none, or it was built without its video processor (`images_only`, what a machine without torchvision builds)."""
    name = type(processor).__name__
    if getattr(processor, "video_token", None) is None:
        raise RowError(
            f"{where} holds a video but {name} takes no videos (its family reads images only); use a family "
            "whose processor has a video processor, or drop the video parts, or pass on_error='skip'.",
            reason="no_video_processor",
        )
    if getattr(processor, "video_processor", None) is None:
        raise RowError(
            f"{where} holds a video but this {name} was built without its video processor (transformers' video "
            f"processors need torchvision); {TORCHVISION_FIX}, or pass on_error='skip'.",
            reason="no_video_processor",
        )
