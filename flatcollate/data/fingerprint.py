"""A fingerprint of everything that decides an encoder's output, for naming cached tokenized datasets.

The key covers the tokenizer's full serialized state (every file `save_pretrained` writes: `tokenizer.json` with the
vocabulary, merges, normalizer, pre-tokenizer, post-processor (BOS/EOS added or not) and added tokens;
`tokenizer_config.json` with `split_special_tokens` and the special tokens; the chat template; a slow tokenizer's
vocabulary files) plus its plain attributes that are not saved, the chat template text and its variables, a
processor's class and settings, every encoder option (the resolved prompt template, not its name or path), `on_error`
and the flatcollate version. The data's key covers the content of every image file a row refers to by path
(`image_files_fingerprint`). Changing any of them gives a new cache file; the same settings reuse it.
"""

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable

from datasets.fingerprint import Hasher

from .encode import Encoder

# Saved or set by loading, never read when encoding: where the tokenizer came from, logging, `as_target_tokenizer`'s
# flag. `padding_side` and `truncation_side` are left out too: encoders neither pad nor truncate.
_NOT_ENCODING = frozenset(
    {
        "name_or_path",
        "is_local",
        "local_files_only",
        "verbose",
        "_in_target_context_manager",
        "padding_side",
        "truncation_side",
    }
)
_PLAIN = (str, int, float, bool, type(None))
_CHUNK = 1 << 20


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the tokenizer's full serialized state and of its plain attributes that `save_pretrained` leaves out.

    The files `tokenizer.save_pretrained` writes are hashed whole (`tokenizer_config.json` without the keys of
    `_NOT_ENCODING`), so any setting that is saved is covered without being named here: `split_special_tokens`, BOS and
    EOS added or not, added tokens and their roles, normalizer and pre-tokenizer, the chat template. The plain
    instance attributes (`str`, `int`, `float`, `bool`, `None`) are hashed too, for what a tokenizer keeps only in
    memory (a slow tokenizer's `legacy`, a changed `add_bos_token` flag). About 0.4 s for Qwen2.5's 7 MB
    `tokenizer.json` (it is written to a temporary folder).
    """
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        files = {}
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, folder)] = _saved_file_digest(path)
    attributes = {
        name: value
        for name, value in vars(tokenizer).items()
        if isinstance(value, _PLAIN) and name not in _NOT_ENCODING
    }
    return Hasher.hash([type(tokenizer).__name__, sorted(files.items()), sorted(attributes.items())])


def _saved_file_digest(path: str) -> str:
    if os.path.basename(path) == "tokenizer_config.json":
        with open(path, encoding="utf-8") as f:
            config = {k: v for k, v in json.load(f).items() if k not in _NOT_ENCODING}
        return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return _file_digest(path)


def _file_digest(path: str | os.PathLike) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def image_files_fingerprint(paths: Iterable[str]) -> str | None:
    """Hash of the content of every image file in `paths`, or `None` when there is none.

    A row that refers to an image by its path keys only the path in the dataset's fingerprint; this keys what the file
    holds (a digest of its bytes, read once), so a file replaced at the same path is encoded again. A path with no
    file is keyed as missing (the row fails or is skipped as `missing_image`, and is encoded again once the file is
    there). Paths relative to the working directory are read from it, as the encoder reads them.
    """
    unique = sorted(set(paths))
    if not unique:
        return None
    return Hasher.hash([(path, _file_digest(path) if os.path.isfile(path) else "missing") for path in unique])


def encoder_fingerprint(encoder: Encoder) -> str:
    """Hash of an encoder's settings and its tokenizer's fingerprint, with the flatcollate version."""
    from .. import __version__  # the package defines it after importing this subpackage

    skip = ("tokenizer", "chat", "processor")
    options = {f.name: getattr(encoder, f.name) for f in dataclasses.fields(encoder) if f.name not in skip}
    chat = None
    if encoder.chat is not None:
        chat = [encoder.chat.chat_template, encoder.chat.template_kwargs]
    parts = [__version__, options, chat, tokenizer_fingerprint(encoder.tokenizer)]
    processor = getattr(encoder, "processor", None)
    if processor is not None:  # its class and settings (image processor, token counts); the tokenizer is above
        # The image processor's class too: a PIL and a torchvision image processor save the same settings under the
        # same type name, and their pixel values differ.
        image_processor = type(getattr(processor, "image_processor", None))
        classes = [type(processor).__name__, f"{image_processor.__module__}.{image_processor.__qualname__}"]
        parts.append([*classes, processor.to_json_string()])
    return Hasher.hash(parts)
