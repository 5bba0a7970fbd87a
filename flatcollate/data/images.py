"""The images of one row as RGB PIL images: opened from paths only when the row is encoded, refused with a reason.

A row's `images` field holds, in the order of its `{"type": "image"}` parts, any of:

- a `PIL.Image.Image` (what `datasets.Image()` decodes to);
- a path (`str` or `os.PathLike`), opened with PIL when the row is encoded, never before;
- a dict `{"bytes": ..., "path": ...}` (what `datasets.Image(decode=False)` gives): the bytes if present, else the path.

Every image is converted to RGB (`"L"`, `"P"`, `"RGBA"`, `"CMYK"` files included) before the processor sees it.
A single image instead of a list is taken as a list of one; `None` as no images.
"""

import io
import os
from pathlib import Path

import PIL.Image
import pyarrow as pa

from .row_errors import RowError, RowTypeError


def as_image_list(value) -> list:
    """The row's images field as a list: `None` -> `[]`, a list or tuple as it is, anything else -> `[value]`."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _open(source, where: str) -> PIL.Image.Image:
    """Decode a path or bytes fully (`convert` reads the pixels), so a truncated file fails here, naming the row."""
    try:
        with PIL.Image.open(source) as image:
            return image.convert("RGB")
    except (PIL.UnidentifiedImageError, OSError) as err:
        raise RowError(
            f"{where} cannot be read as an image ({type(err).__name__}: {err}); replace or remove the file, or pass "
            "on_error='skip'.",
            reason="bad_image",
        ) from err


def load_image(value, *, where: str) -> PIL.Image.Image:
    """One image as an RGB `PIL.Image.Image`.

    Args:
        value (`PIL.Image.Image`, `str`, `os.PathLike` or `dict`): see the module docstring.
        where (`str`): row, field and image index, for error messages.

    Raises:
        `RowError` with reason `missing_image` (no file at the path) or `bad_image` (not decodable), and
        `RowTypeError` with reason `bad_image` (not an image, a path or an image dict).

    >>> load_image(PIL.Image.new("L", (3, 2)), where="row 0: field 'images', image 0").mode
    'RGB'
    """
    if isinstance(value, PIL.Image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")
    if isinstance(value, dict) and value.get("bytes") is not None:
        return _open(io.BytesIO(value["bytes"]), where)
    path = value.get("path") if isinstance(value, dict) else value
    if not isinstance(path, str | os.PathLike):
        raise RowTypeError(
            f"{where} is a {type(value).__name__} ({value!r:.60}); expected a PIL image, a file path or a "
            "{'bytes', 'path'} dict (cast the column with datasets.Image() or store paths).",
            reason="bad_image",
        )
    if not Path(path).is_file():
        raise RowError(
            f"{where}: no image file at {str(path)!r} (relative to {os.getcwd()!r}); fix the path or the working "
            "directory, or pass on_error='skip'.",
            reason="missing_image",
        )
    return _open(path, where)


def load_images(values: list, *, where: str) -> list[PIL.Image.Image]:
    """`load_image` for each image of a row, in order; `where` names the row and field, the index is added."""
    return [load_image(value, where=f"{where}, image {i}") for i, value in enumerate(values)]


def image_paths(column: pa.Array | pa.ChunkedArray) -> list[str]:
    """The file paths an images column refers to, as `load_image` reads them: strings, and the `path` of image
    dicts without `bytes` (`datasets.Image()` stores a file given by its path that way), at any list depth.

    Args:
        column (`pyarrow.Array` or `pyarrow.ChunkedArray`): the column as the dataset stores it (`dataset.data`).

    Returns:
        `list[str]`: one entry per image given by its path (repeats kept). Images held as bytes, and columns of any
        other type, give none: their content is in the dataset's own fingerprint.

    >>> image_paths(pa.array([["a.png", None], [], ["b.png"]]))
    ['a.png', 'b.png']
    >>> image_paths(pa.array([[{"bytes": None, "path": "a.png"}, {"bytes": b"...", "path": "b.png"}]]))
    ['a.png']
    """
    if isinstance(column, pa.ChunkedArray):
        return [path for chunk in column.chunks for path in image_paths(chunk)]
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return image_paths(column.flatten())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.drop_null().to_pylist()
    if pa.types.is_struct(kind) and kind.get_field_index("path") >= 0:
        fields = dict(zip([kind.field(i).name for i in range(kind.num_fields)], column.flatten(), strict=True))
        paths = fields["path"]
        if "bytes" in fields:  # the bytes win over the path when both are there
            paths = paths.filter(fields["bytes"].is_null())
        return paths.drop_null().to_pylist()
    return []
