"""Length profiles: how long the prompts and completions of a dataset are, so benchmarks can draw realistic batches.

A profile (`flatcollate.profiles.length_profile.LengthProfile`) is a joint histogram of `(prompt_length,
completion_length)`; this module finds one by name or builds one from your own data, and measures what padding costs.

Named profiles ship with the package (`flatcollate/profiles/data/*.json`), derived from real datasets tokenized with
the Qwen2.5 tokenizer (no chat template): "flan", "gsm8k", "code_alpaca", "hh_rlhf". `load_profile` also reads your
own data: a tokenized dataset saved with `datasets.Dataset.save_to_disk` (`input_ids` and `labels`), or a file of
lengths (JSON or text).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .._conventions import IGNORE_INDEX
from .._paths import expand_path
from .length_profile import LengthProfile
from .names import PROFILES_DIR, available_profiles


def padded_batches(lengths, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and computed tokens of each batch when consecutive rows are batched `batch_size` at a time and padded to
    the longest row of their batch; a last partial batch keeps its own size.

    Args:
        lengths (array-like of shape `(N,)`, positive ints): the length of each row, in batch order.
        batch_size (`int`): rows per batch.

    Returns:
        `(real, padded)`, each `np.ndarray` of shape `(ceil(N / batch_size),)`, int64.

    >>> padded_batches([4, 2, 1, 1], batch_size=2)  # [a a a a] [b b . .] | [c] [d]
    (array([6, 2]), array([8, 2]))
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if batch_size < 1 or lengths.size == 0:
        raise ValueError(
            f"Padded batches need batch_size >= 1 and at least one row, got {batch_size} and {lengths.size}."
        )
    starts = np.arange(0, lengths.size, batch_size)
    rows = np.diff(np.append(starts, lengths.size))
    return np.add.reduceat(lengths, starts), rows * np.maximum.reduceat(lengths, starts)


def padded_fill(lengths, *, batch_size: int) -> float:
    """Share of real tokens over the whole run in `padded_batches` (real tokens / padded tokens), the quantity that
    sets the cost of padding.

    >>> padded_fill([4, 2, 1, 1], batch_size=2)
    0.8
    """
    real, padded = padded_batches(lengths, batch_size=batch_size)
    return float(real.sum() / padded.sum())


def load_profile(name_or_path: str | os.PathLike | LengthProfile) -> LengthProfile:
    """A named profile, or one built from your own data.

    Args:
        name_or_path: one of `available_profiles()`; a folder saved by `datasets.Dataset.save_to_disk` with
            `input_ids` and `labels` (prompt tokens are those labelled -100); a `.json` file holding a saved
            profile, `{"rows": [[prompt, completion], ...]}`, a list of `[prompt, completion]` pairs or a list of
            total lengths; or a text file with one row per line: `total` or `prompt completion`.

    Returns:
        `LengthProfile`.

    >>> load_profile("gsm8k").name
    'gsm8k'
    """
    if isinstance(name_or_path, LengthProfile):
        return name_or_path
    text = os.fspath(name_or_path)
    if text in available_profiles():
        return _profile_from_dict(json.loads((PROFILES_DIR / f"{text}.json").read_text()), origin=text)
    path = expand_path(text)
    if path.is_dir():
        return _profile_from_dataset(path)
    if path.is_file():
        return _profile_from_file(path)
    raise ValueError(
        f"Unknown length profile {text!r}: not a named profile ({', '.join(available_profiles())}), and no file or "
        "folder exists at that path. Pass a name, a tokenized dataset folder, or a JSON/text file of lengths."
    )


WHAT_A_PROFILE_IS = (
    "A length profile is a named one ({names}); a folder of a tokenized dataset saved with `save_to_disk` (columns "
    "input_ids and labels, prompt labels -100); or a file of token lengths: text with one `total` or "
    '`prompt completion` per line, or JSON {{"rows": [[prompt, completion], ...]}}. To profile your own raw data, '
    "tokenize it with `flatcollate.make_supervised_dataset(tokenizer, path)`, `.save_to_disk(folder)` the result "
    "and pass the folder."
)
"""Appended to the errors of files that are not lengths (a raw dataset, say): what to pass instead."""


def _not_a_profile(path: Path, why: str) -> ValueError:
    return ValueError(
        f"{path} is not a length profile: {why}. " + WHAT_A_PROFILE_IS.format(names=", ".join(available_profiles()))
    )


def _profile_from_file(path: Path) -> LengthProfile:
    """Profile from a saved profile JSON, a JSON of rows or lengths, or a text file of lengths."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise _not_a_profile(path, "it is not a text file (compressed or binary)") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is not valid JSON ({err}); pass a JSON file of lengths or a saved profile."
            ) from err
        if isinstance(data, dict) and "cells" in data:
            return _profile_from_dict(data, origin=str(path))
        rows = data.get("rows") if isinstance(data, dict) else data
        if rows is None:
            raise ValueError(f"{path} holds a JSON object without `rows` or `cells`; expected lengths or a profile.")
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            raise _not_a_profile(path, f"its rows are records with fields {sorted(rows[0])[:4]}, not token lengths")
        return _profile_from_rows(rows, name=path.stem, origin=str(path))
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    for number, line in lines:
        words = line.split()
        if len(words) > 2 or not all(_is_number(word) for word in words):
            shown = line if len(line) <= 40 else line[:40] + "..."
            raise _not_a_profile(path, f"line {number} reads {shown!r}, not one or two token counts")
    return _profile_from_rows([line.split() for _, line in lines], name=path.stem, origin=str(path))


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _profile_from_rows(rows, *, name: str, origin: str) -> LengthProfile:
    """Rows are `total` or `[prompt, completion]`; a lone total counts as all completion (every token trained)."""
    try:
        table = np.asarray(rows, dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(
            f"{origin}: rows of lengths must all be a number or all a pair [prompt, completion] of token counts."
        ) from None
    if table.ndim == 2 and table.shape[1] == 1:
        table = table[:, 0]
    if table.ndim == 1:
        table = np.stack([np.zeros_like(table), table], axis=1)
    if table.ndim != 2 or table.shape[1] != 2:
        raise ValueError(f"{origin}: expected N totals or N pairs [prompt, completion], got shape {table.shape}.")
    if not np.isfinite(table).all() or (table != np.round(table)).any():
        row = int(np.flatnonzero(~np.isfinite(table).all(1) | (table != np.round(table)).any(1))[0])
        raise ValueError(f"{origin}: row {row} holds {table[row].tolist()}, not whole token counts.")
    return LengthProfile.from_lengths(table[:, 0], table[:, 1], name=name, source=origin)


def _profile_from_dataset(path: Path) -> LengthProfile:
    """Prompt and completion lengths of a tokenized dataset, counted on its arrow columns (no per-token loop)."""
    import datasets
    import pyarrow.compute as pc

    try:
        dataset = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        raise ValueError(f"{path} is a folder but not a dataset saved with `save_to_disk` ({err}).") from err
    if isinstance(dataset, datasets.DatasetDict):
        raise ValueError(f"{path} holds several splits {list(dataset)}; pass the folder of one split.")
    missing = [col for col in ("input_ids", "labels") if col not in dataset.column_names]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}; tokenize it with `input_ids` and `labels` first.")
    table = dataset.with_format("arrow")[:]
    totals = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    labels = table.column("labels").combine_chunks()
    label_lengths = pc.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64)
    if (label_lengths != totals).any():
        row = int(np.flatnonzero(label_lengths != totals)[0])
        raise ValueError(
            f"{path}: row {row} has {totals[row]} input_ids but {label_lengths[row]} labels; they must match."
        )
    ignored = np.asarray(labels.flatten()) == IGNORE_INDEX
    # Per-row count of ignored labels from the list offsets: prefix sums differenced at row boundaries.
    prefix = np.concatenate([[0], np.cumsum(ignored, dtype=np.int64)])
    offsets = np.concatenate([[0], np.cumsum(totals)])
    prompt = prefix[offsets[1:]] - prefix[offsets[:-1]]
    return LengthProfile.from_lengths(prompt, totals - prompt, name=path.name, source=str(path))


def _profile_from_dict(data: dict, *, origin: str) -> LengthProfile:
    """Rebuild a profile written by `LengthProfile.save`, checking what would make sampling wrong."""
    if data.get("format") != "flatcollate.length_profile/1":
        raise ValueError(f"{origin}: not a length profile (format {data.get('format')!r}); re-create it with `save`.")
    profile = LengthProfile(
        name=data["name"],
        prompt_edges=np.asarray(data["prompt_edges"], dtype=np.int64),
        completion_edges=np.asarray(data["completion_edges"], dtype=np.int64),
        cells=np.asarray(data["cells"], dtype=np.int64).reshape(-1, 2),
        counts=np.asarray(data["counts"], dtype=np.int64),
        source=data.get("source", ""),
    )
    bad_edges = any((np.diff(e) <= 0).any() for e in (profile.prompt_edges, profile.completion_edges))
    if bad_edges or len(profile.cells) != len(profile.counts) or (profile.counts <= 0).any():
        raise ValueError(f"{origin}: corrupt length profile (edges must increase, one positive count per cell).")
    return profile
