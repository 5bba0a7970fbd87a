"""A fingerprint of everything that decides an encoder's output, for naming cached tokenized datasets.

The key covers the tokenizer (class, vocabulary and merges, added and special tokens and which role each plays), the
chat template text and its variables, a processor's class and settings, every encoder option (the resolved prompt
template, not its name or path), `on_error`, and the flatcollate version. Changing any of them gives a new cache
file; the same settings reuse it.
"""

import dataclasses
import hashlib

from datasets.fingerprint import Hasher

from .encode import Encoder


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the tokenizer's vocabulary, merges, normalizer and pre/post-processing (the whole `tokenizer.json` of a
    fast tokenizer), its added tokens and its special-token roles (which token is BOS, EOS, ...)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    # One string for fast tokenizers (0.2-0.5 s for Qwen2.5's 4.6 MB); the vocabulary otherwise.
    if backend is not None:
        model = hashlib.sha256(backend.to_str().encode()).hexdigest()
    else:
        model = sorted(tokenizer.get_vocab().items())
    special = {name: getattr(tokenizer, f"{name}_id", None) for name in tokenizer.special_tokens_map}
    added = sorted((i, t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items())
    return Hasher.hash([type(tokenizer).__name__, model, tokenizer.special_tokens_map, special, added])


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
        parts.append([type(processor).__name__, processor.to_json_string()])
    return Hasher.hash(parts)
