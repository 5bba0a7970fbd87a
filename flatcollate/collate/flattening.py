"""`DataCollatorWithFlattening`: a vectorized, stricter superset of the transformers collator of the same name."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import transformers

from .._conventions import IGNORE_INDEX
from ..boundaries import cu_seqlens_to_position_ids, cu_seqlens_to_seq_idx, max_length, sequence_starts
from .flatten import flatten_features
from .padding import pad_as_own_segment


class DataCollatorWithFlattening(transformers.DataCollatorWithFlattening):
    """Concatenates a mini-batch into one row with restarting positions and the boundaries attention kernels need.

    Three examples of lengths 3, 1 and 2 (the first label of every sequence becomes `separator_id`, so the last token
    of one sequence never learns to predict the first token of the next)::

        input_ids      [a0 a1 a2 | b0 | c0 c1]
        labels         [-100 a1 a2 | -100 | -100 c1]
        position_ids   [0 1 2 | 0 | 0 1]                 (1, T) int64
        seq_idx        [0 0 0 | 1 | 2 2]                 (1, T) int32
        cu_seq_lens_q  [0 3 4 6]                         (N + 1,) int32, same for cu_seq_lens_k
        max_length_q   3                                 Python int, same for max_length_k

    No `attention_mask` is emitted: with one, transformers' SDPA/eager paths attend across sequences. Prepare the
    model with `flatcollate.prepare_model_for_flattening` so such setups fail loudly.

    Differences from `transformers.DataCollatorWithFlattening` (same constructor arguments, keys, shapes, dtypes):
    no Python loop over tokens; arrays and tensors are read without a `.tolist()` round trip; flash-attention kwargs and
    `seq_idx` are on by default; `completion_mask` / `assistant_masks` set labels to -100 where they are 0; packed
    examples (`seq_lengths`, or restarting `position_ids`) keep their inner boundaries; bad input raises instead of
    being mixed or dropped.

    Args:
        return_position_ids (`bool`, defaults to `True`): emit `position_ids`.
        separator_id (`int` or `None`, defaults to -100): label given to the first token of every sequence. Causal
            LMs shift labels inside the model, so -100 keeps the last token of one sequence from learning the first
            of the next. `None` keeps every label, for heads that label each token in place
            (`*ForTokenClassification`).
        return_flash_attn_kwargs (`bool`, defaults to `True`): emit `cu_seq_lens_q/k` and `max_length_q/k`.
        return_seq_idx (`bool`, defaults to `True`): emit `seq_idx` (for state-space and linear-attention layers).
        position_ids_start (`int`, defaults to 0): position of the first token of every sequence.
        pad_to_multiple_of (`int`, *optional*): pad the row to a multiple of this many tokens. The padding is a
            sequence of its own (`pad_token_id` tokens, labels -100, positions restarting at `position_ids_start`,
            its own `cu_seq_lens` entry and `seq_idx`), so it never joins a real sequence's attention.
        pad_token_id (`int`, defaults to 0): token used for that padding; it is never attended to by real tokens.
        vocab_size (`int`, *optional*): when given, ids outside `[0, vocab_size)` raise.
        max_seq_len (`int`, *optional*): when given, a sequence longer than this raises (nothing is truncated).
        return_tensors (`str`, defaults to `"pt"`): `"pt"` or `"np"`.

    Example:

    >>> collator = DataCollatorWithFlattening()
    >>> batch = collator([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> sorted(batch)
    ['cu_seq_lens_k', 'cu_seq_lens_q', 'input_ids', 'labels', 'max_length_k', 'max_length_q', 'position_ids', 'seq_idx']
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 6, 7, -100, 9]], [[0, 1, 2, 0, 1]], [0, 3, 5])
    """

    def __init__(
        self,
        *args,
        return_position_ids: bool = True,
        separator_id: int | None = IGNORE_INDEX,
        return_flash_attn_kwargs: bool = True,
        return_seq_idx: bool = True,
        position_ids_start: int = 0,
        pad_to_multiple_of: int | None = None,
        pad_token_id: int = 0,
        vocab_size: int | None = None,
        max_seq_len: int | None = None,
        **kwargs,
    ):
        super().__init__(
            *args,
            return_position_ids=return_position_ids,
            separator_id=separator_id,
            return_flash_attn_kwargs=return_flash_attn_kwargs,
            return_seq_idx=return_seq_idx,
            position_ids_start=position_ids_start,
            **kwargs,
        )
        if not (return_position_ids or return_flash_attn_kwargs or return_seq_idx):
            raise ValueError(
                "A flattening collator with `return_position_ids`, `return_flash_attn_kwargs` and `return_seq_idx` all "
                "False emits no boundary: the model would run each batch as one sequence, every example attending to "
                "the others. Keep at least one of them (`return_position_ids=True` is what transformers' own "
                "padding-free path reads)."
            )
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive int or None, got {pad_to_multiple_of}.")
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len

    def __call__(
        self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None, separator_id: int | None = None
    ) -> dict[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}.")
        separator_id = self.separator_id if separator_id is None else separator_id
        flat = flatten_features(features, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        input_ids, labels, cu_seqlens = flat["input_ids"], flat["labels"], flat["cu_seqlens"]
        if separator_id is not None:  # None: labels in place (token classification), nothing to separate
            labels[sequence_starts(cu_seqlens)] = separator_id
        if self.pad_to_multiple_of:
            input_ids, labels, cu_seqlens = pad_as_own_segment(
                input_ids, labels, cu_seqlens, multiple=self.pad_to_multiple_of, pad_token_id=self.pad_token_id
            )
        batch: dict[str, Any] = {"input_ids": input_ids[None], "labels": labels[None]}
        if self.return_position_ids:
            batch["position_ids"] = cu_seqlens_to_position_ids(cu_seqlens, self.position_ids_start)[None]
        if self.return_seq_idx:
            batch["seq_idx"] = cu_seqlens_to_seq_idx(cu_seqlens)[None]
        if self.return_flash_attn_kwargs:
            batch["cu_seq_lens_q"] = cu_seqlens
            batch["cu_seq_lens_k"] = cu_seqlens.copy()
            batch["max_length_q"] = batch["max_length_k"] = max_length(cu_seqlens)
        if return_tensors == "pt":
            batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return batch
