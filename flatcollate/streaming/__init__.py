"""Streaming packing: tokenize, shard and pack a stream on the fly, and resume it exactly.

Imports from flatcollate: `_conventions`, `boundaries`, `collate`, `data`.
"""

from .interleaving import interleave
from .loader_state import load_loader_state
from .packer import StreamingPacker
from .skips import StreamStats

__all__ = ["StreamStats", "StreamingPacker", "interleave", "load_loader_state"]
