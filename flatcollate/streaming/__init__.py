"""Streaming packing: tokenize, shard and pack a stream on the fly, and resume it exactly."""

from .bins import OnlineBins
from .examples import encode_row, fit_to_pack
from .packer import StreamingPacker
from .skips import StreamStats
from .sources import InterleavedSource, IterableSource, RowSource, SequenceSource, as_source, interleave

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
]
