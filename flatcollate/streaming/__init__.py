"""Streaming packing: tokenize, shard and pack a stream on the fly, and resume it exactly.

Imports from flatcollate: `_conventions`, `boundaries`, `collate`, `data`.
"""

from .bins import OnlineBins
from .examples import encode_row, fit_to_pack
from .interleaving import InterleavedSource, interleave
from .loader_state import load_loader_state, saved_num_workers
from .packer import StreamingPacker
from .skips import StreamStats
from .sources import IterableSource, RowSource, SequenceSource, as_source

__all__ = [
    "InterleavedSource",
    "IterableSource",
    "OnlineBins",
    "RowSource",
    "SequenceSource",
    "StreamStats",
    "StreamingPacker",
    "as_source",
    "encode_row",
    "fit_to_pack",
    "interleave",
    "load_loader_state",
    "saved_num_workers",
]
