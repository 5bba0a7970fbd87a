"""Raw files or datasets to a tokenized supervised dataset (`input_ids`, `labels`), cached by fingerprint.

Sources (JSON arrays, JSONL, optionally gzipped, Parquet, or `datasets.Dataset` objects) are concatenated, encoded by
`build_encoder` inside `datasets.map` (batched, `num_proc`, progress bar), and shuffled with a seed. With a
`cache_dir`, the result is stored under a name derived from the data's fingerprint and everything that decides the
encoding (`flatcollate.data.fingerprint`), so a second run with the same inputs loads it instead of tokenizing again.
Rows that cannot be encoded raise, or with `on_error="skip"` are dropped, counted by reason and reported.
"""

import gzip
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from .._paths import expand_path
from .encoders import build_encoder
from .fingerprint import encoder_fingerprint
from .row_errors import SkippedRow

logger = logging.getLogger(__name__)
_SHOWN = 5  # row indices and messages kept per skip reason
# Declared so that a batch of only skipped rows (empty lists) cannot change the column types.
_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int64")),
        "labels": datasets.List(datasets.Value("int64")),
        "skip_reason": datasets.Value("string"),
        "skip_message": datasets.Value("string"),
    }
)


def _read_json_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if ".jsonl" in path.suffixes:
        rows = []
        # One parse per line so a corrupt line is reported with its number.
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number}: invalid JSON ({err.msg}); fix or remove the line.") from err
        return rows
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON at line {err.lineno} ({err.msg}).") from err
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return datasets.Dataset.from_dict(data).to_list()
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rows or a dict of columns, got {type(data).__name__}.")
    return data


def load_source(source: str | os.PathLike | datasets.Dataset) -> datasets.Dataset:
    """One source as a `datasets.Dataset`: a `Dataset` as is, or a `.json`, `.jsonl`, `.jsonl.gz` or `.parquet` file."""
    if isinstance(source, datasets.Dataset):
        return source
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"a data source must be a path or a datasets.Dataset, got {type(source).__name__}.")
    path = expand_path(source)
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist.")
    if path.suffix == ".parquet":
        return datasets.Dataset(pq.read_table(path))
    if {".json", ".jsonl"} & set(path.suffixes):
        rows = _read_json_rows(path)
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if bad is not None:
            raise ValueError(f"{path} row {bad}: expected a JSON object, got {rows[bad]!r:.60}.")
        return datasets.Dataset.from_list(rows)
    raise ValueError(f"{path}: unknown file type; use .json, .jsonl, .jsonl.gz or .parquet, or pass a Dataset.")


@dataclass(frozen=True)
class EncodeStats:
    """What `make_supervised_dataset(..., return_stats=True)` did with the rows.

    Args:
        num_rows (`int`): rows read from the sources.
        num_encoded (`int`): rows in the returned dataset.
        skipped (`dict[str, int]`): skipped rows per reason (see `flatcollate.data.row_errors`).
        first_skipped (`dict[str, list[int]]`): the first few skipped row indices per reason, in source order.
        first_messages (`dict[str, str]`): the error message of the first skipped row per reason.
    """

    num_rows: int
    num_encoded: int
    skipped: dict[str, int] = field(default_factory=dict)
    first_skipped: dict[str, list[int]] = field(default_factory=dict)
    first_messages: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"encoded {self.num_encoded} of {self.num_rows} rows"]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            rows = ", ".join(map(str, self.first_skipped[reason]))
            more = ", ..." if count > len(self.first_skipped[reason]) else ""
            lines.append(f"  skipped {count} ({reason}): rows {rows}{more}; first: {self.first_messages[reason]}")
        return "\n".join(lines)


def _skip_stats(encoded: datasets.Dataset) -> tuple[EncodeStats, np.ndarray]:
    """Counts of skipped rows by reason, and the indices of the rows kept."""
    reasons = np.asarray(encoded.data.column("skip_reason").to_numpy(zero_copy_only=False), dtype=object)
    skipped = np.flatnonzero(reasons != "")
    counts, first, messages = Counter(reasons[skipped].tolist()), {}, {}
    for reason in counts:
        rows = skipped[reasons[skipped] == reason][:_SHOWN]
        first[reason] = rows.tolist()
        messages[reason] = encoded[int(rows[0])]["skip_message"]
    kept = np.flatnonzero(reasons == "")
    return EncodeStats(len(encoded), len(kept), dict(counts), first, messages), kept


def make_supervised_dataset(
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    data,
    *,
    seed: int | None = 42,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 1000,
    on_error: str = "raise",
    return_stats: bool = False,
    **encoder_options,
) -> datasets.Dataset | tuple[datasets.Dataset, EncodeStats]:
    """Tokenize raw supervised data into `input_ids` and `labels` (prompt tokens -100), shuffled (seed 42) by default.

    Args:
        tokenizer (`PreTrainedTokenizerFast` or `ProcessorMixin`): a processor (with an image processor) also encodes
            the images of `"messages"` rows (`flatcollate.data.vision_encode`).
        data (path, `datasets.Dataset`, or a list of them): sources, concatenated in order.
        seed (`int`, *optional*, defaults to 42): the rows are shuffled with this seed after encoding; `None` keeps
            the sources' order.
        num_proc (`int`, *optional*): worker processes for tokenization.
        cache_dir (`str`, *optional*): where to keep the tokenized dataset, keyed by the data's fingerprint, the
            content of the image files rows refer to by path, and everything that decides the encoding (the
            tokenizer's serialized state, chat template, encoder options, `on_error`, flatcollate version).
        batch_size (`int`, *optional*, defaults to 1000): rows per `datasets.map` batch.
        on_error (`str`, *optional*, defaults to `"raise"`): `"raise"` the first `RowError`, or `"skip"` rows that
            cannot be encoded; skipped rows are counted by reason and logged (a warning with the first row indices).
        return_stats (`bool`, *optional*, defaults to `False`): also return an `EncodeStats`.
        **encoder_options: `format`, `template`, `chat_template`, `chat_template_kwargs`, `add_eos` and the
            `*_field` options of `build_encoder`.

    Returns:
        `datasets.Dataset` with `input_ids` and `labels` (lists of int, equal lengths per row); other columns removed.
        With a processor, also its per-token fields (`mm_token_type_ids` or `token_type_ids`, lists of int) and
        vision fields (`pixel_values`, `image_grid_thw`, ...) as nested lists, `None` in rows without images;
        `dataset.with_format("torch")` (or `"numpy"`) gives them back as the processor's arrays for one row.
        With `return_stats=True`, `(dataset, EncodeStats)`.
    """
    sources = data if isinstance(data, list | tuple) else [data]
    if not sources:
        raise ValueError("data is empty; pass a path, a datasets.Dataset, or a list of them.")
    dataset = datasets.concatenate_datasets([load_source(s) for s in sources])
    encoder = build_encoder(tokenizer, on_error=on_error, **encoder_options)
    # A processor's encoder adds its per-token and vision fields; a row without them (no images) stores None.
    extra = datasets.Features(encoder.extra_features())

    def encode_batch(batch: dict, indices: list[int]) -> dict:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        # One encoder call per row: templates and tokenizers work on whole examples.
        encoded = [encoder(row, index=i) for row, i in zip(rows, indices, strict=True)]
        skips = [e if isinstance(e, SkippedRow) else None for e in encoded]
        columns = {key: [None if s else e.get(key) for e, s in zip(encoded, skips, strict=True)] for key in extra}
        return {
            "input_ids": [[] if s else e["input_ids"] for e, s in zip(encoded, skips, strict=True)],
            "labels": [[] if s else e["labels"] for e, s in zip(encoded, skips, strict=True)],
            **columns,
            "skip_reason": [s.reason if s else "" for s in skips],
            "skip_message": [s.message if s else "" for s in skips],
        }

    # Our own key also spares `datasets` from hashing the function, which pickles the whole tokenizer (seconds).
    key = Hasher.hash([dataset._fingerprint, encoder_fingerprint(encoder), encoder.files_key(dataset)])
    cache_file = None
    if cache_dir is not None:
        cache_dir = expand_path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache_file = str(cache_dir / f"supervised-{key}.arrow")
    # Encode before shuffling so an error names the row in the order the sources were given.
    encoded = dataset.map(
        encode_batch,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        remove_columns=dataset.column_names,
        features=datasets.Features({**_FEATURES, **extra}),
        new_fingerprint=key,
        num_proc=num_proc,
        cache_file_name=cache_file,
        load_from_cache_file=cache_file is not None,
        desc="Tokenizing",
    )
    stats, kept = _skip_stats(encoded)
    if stats.skipped:
        logger.warning("make_supervised_dataset: %s", stats)
        encoded = encoded.select(kept)
    encoded = encoded.remove_columns(["skip_reason", "skip_message"])
    if seed is not None:
        encoded = encoded.shuffle(seed=seed)
    return (encoded, stats) if return_stats else encoded
