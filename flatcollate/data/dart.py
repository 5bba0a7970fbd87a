"""DART-Math's names, mapped onto flatcollate's pipeline: the one compatibility layer of the library, so code written
for DART-Math runs after one import line changes (`from flatcollate.data.dart import PackedDataset,
make_supervised_dset`).

| DART-Math                                              | flatcollate                                        |
|--------------------------------------------------------|----------------------------------------------------|
| `make_supervised_dset(tokenizer, data_path, ...)`      | `make_supervised_dataset(tokenizer, data, ...)`    |
| `PackedDataset(dataset, tokenizer, pack_len, seed)`    | `flatcollate.data.PackedDataset` (same signature)  |
| `PackedDataset.stat()`                                 | `PackedDataset.stats()`                            |
"""

import os

import datasets
from transformers import PreTrainedTokenizerBase

from . import dataset
from .dataset import PackingStats
from .supervised import make_supervised_dataset


def make_supervised_dset(
    tokenizer: PreTrainedTokenizerBase,
    data_path,
    *,
    query_field: str = "query",
    resp_field: str = "response",
    prompt_template: str | dict = "alpaca",
    shuffle_seed: int | None = 42,
    tokenized_cache_home: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Tokenize instruction data with query/response fields into `input_ids` and `labels` (prompt tokens -100).

    Args:
        tokenizer (`PreTrainedTokenizerBase`).
        data_path (path, `datasets.Dataset`, or a list of them).
        query_field (`str`, *optional*, defaults to `"query"`), resp_field (`str`, *optional*, defaults to
            `"response"`): field names of the question and the answer.
        prompt_template (`str` or `dict`, *optional*, defaults to `"alpaca"`): see `flatcollate.data.prompt_templates`.
        shuffle_seed (`int`, *optional*, defaults to 42): `None` keeps the order.
        tokenized_cache_home (`str`, *optional*): cache folder for the tokenized dataset.
        num_proc (`int`, *optional*): tokenization workers.

    Returns:
        `datasets.Dataset` with `input_ids` and `labels`; wrap it in `PackedDataset(dset, tokenizer, pack_len)`.
    """
    return make_supervised_dataset(
        tokenizer,
        data_path,
        format="instruction",
        template=prompt_template,
        query_field=query_field,
        resp_field=resp_field,
        seed=shuffle_seed,
        cache_dir=tokenized_cache_home,
        num_proc=num_proc,
    )


class PackedDataset(dataset.PackedDataset):
    """`flatcollate.data.PackedDataset` with DART-Math's name for its statistics, `stat()`."""

    def stat(self) -> PackingStats:
        """Print and return the `PackingStats` (`stats()`)."""
        return self.stats()


__all__ = ["PackedDataset", "make_supervised_dset"]
