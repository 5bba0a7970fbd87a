"""Raw files or datasets to a tokenized supervised dataset (`input_ids`, `labels`), cached by fingerprint.

Sources (JSON arrays, JSONL, optionally gzipped, Parquet, or `datasets.Dataset` objects) are concatenated, shuffled
with a seed, and encoded by `build_encoder` inside `datasets.map` (batched, `num_proc`, progress bar). With a
`cache_dir`, the result is stored under a name derived from the data's fingerprint and the encoder's options, so a
second run with the same inputs loads it instead of tokenizing again.
"""

import gzip
import json
import os
from pathlib import Path

import datasets
import pyarrow.parquet as pq
from datasets.fingerprint import Hasher

from .encode import build_encoder


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
    path = Path(source)
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


def make_supervised_dataset(
    tokenizer,
    data,
    *,
    seed: int | None = 42,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 1000,
    **encoder_options,
) -> datasets.Dataset:
    """Tokenize raw supervised data into `input_ids` and `labels` (prompt tokens -100).

    Args:
        tokenizer (`PreTrainedTokenizerBase`).
        data (path, `datasets.Dataset`, or a list of them): sources, concatenated in order.
        seed (`int`, *optional*, defaults to 42): shuffle seed; `None` keeps the order.
        num_proc (`int`, *optional*): worker processes for tokenization.
        cache_dir (`str`, *optional*): where to keep the tokenized dataset, keyed by data and options fingerprint.
        batch_size (`int`, *optional*, defaults to 1000): rows per `datasets.map` batch.
        **encoder_options: `format`, `template`, `chat_template`, `chat_template_kwargs`, `add_eos` and the
            `*_field` options of `build_encoder`.

    Returns:
        `datasets.Dataset` with `input_ids` and `labels` (lists of int, equal lengths per row); other columns removed.
    """
    sources = data if isinstance(data, list | tuple) else [data]
    if not sources:
        raise ValueError("data is empty; pass a path, a datasets.Dataset, or a list of them.")
    dataset = datasets.concatenate_datasets([load_source(s) for s in sources])
    encoder = build_encoder(tokenizer, **encoder_options)

    def encode_batch(batch: dict, indices: list[int]) -> dict:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        # One encoder call per row: templates and tokenizers work on whole examples.
        encoded = [encoder(row, index=i) for row, i in zip(rows, indices, strict=True)]
        return {"input_ids": [e["input_ids"] for e in encoded], "labels": [e["labels"] for e in encoded]}

    cache_file = None
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
        key = Hasher.hash([dataset._fingerprint, encoder_options, tokenizer.name_or_path, len(tokenizer)])
        cache_file = str(Path(cache_dir) / f"supervised-{key}.arrow")
    # Encode before shuffling so an error names the row in the order the sources were given.
    encoded = dataset.map(
        encode_batch,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        cache_file_name=cache_file,
        load_from_cache_file=cache_file is not None,
        desc="Tokenizing",
    )
    return encoded.shuffle(seed=seed) if seed is not None else encoded
