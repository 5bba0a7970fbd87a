"""What a processor does to the rendered text beyond expanding image placeholders, and the per-token types it states.

Some processors lay the text out before they expand the placeholders (PaliGemma writes BOS after the last image and a
newline at the end); their `text_replacement_offsets` and `offset_mapping` refer to that text, not to the rendered
one. The replies' spans are moved into it (`move_spans`) before they are moved across the expanded placeholders::

    rendered   user: <image>hi  assistant: |yo<|im_end|>\\n|
    laid out   user: <image><bos>hi  assistant: |yo<|im_end|>\\n|\\n
    expanded   user: <image><image><image><image><bos>hi  assistant: |yo<|im_end|>\\n|\\n

A processor that returns `labels` beside `token_type_ids` (PaliGemma) states that its token types mark a prefix
(type 0, attended both ways) and the suffix it trains (type 1, causal); with no `suffix=` it marks the whole row as
prefix. `prefix_token_types` ends the prefix where the first reply starts.
"""

import difflib

import numpy as np

from .row_errors import RowError


def processor_text(processor, text: str, images: list) -> str:
    """The text `processor` tokenizes before expanding placeholders (`prepare_inputs_layout`, where it has one)."""
    layout = getattr(processor, "prepare_inputs_layout", None)
    if layout is None:
        return text
    _, texts, *_ = layout(images=[images] if images else None, text=[text])
    return text if texts is None else texts[0]


def move_spans(spans: np.ndarray, source: str, target: str, *, where: str) -> np.ndarray:
    """Character spans of `source` moved into `target`, the same text with some inserted.

    Args:
        spans (`np.ndarray` of shape `(S, 2)`, int64): `[start, end)` spans of `source`, each at least one character.
        source (`str`), target (`str`): the rendered text and the processor's laid-out text.
        where (`str`): how errors name the row.

    Returns:
        `np.ndarray` of shape `(S, 2)`, int64: each span's first and last character where it lies in `target`.

    Raises:
        `RowError` (reason `processor_rewrites_text`): a span's end lies in text the processor replaced or removed.

    >>> move_spans(np.array([[0, 2], [5, 7]]), "ab<i>cd", "ab<i>Bcd\\n", where="row 0").tolist()
    [[0, 2], [6, 8]]
    """
    if source == target or len(spans) == 0:
        return spans
    blocks = difflib.SequenceMatcher(None, source, target, autojunk=False).get_matching_blocks()
    starts = np.array([b.a for b in blocks], dtype=np.int64)
    targets = np.array([b.b for b in blocks], dtype=np.int64)
    sizes = np.array([b.size for b in blocks], dtype=np.int64)
    ends = np.stack([spans[:, 0], spans[:, 1] - 1], axis=1)  # first and last character of each span
    block = np.searchsorted(starts, ends, side="right") - 1
    if (block < 0).any() or (ends >= starts[block] + sizes[block]).any():
        raise RowError(
            f"{where}: the processor rewrites the rendered text inside a reply (not only inserting text), so its "
            "tokens cannot be matched to the replies; render the text the processor expects with chat_template=...",
            reason="processor_rewrites_text",
        )
    moved = ends - starts[block] + targets[block]
    return np.stack([moved[:, 0], moved[:, 1] + 1], axis=1)


def prefix_token_types(trained: np.ndarray) -> np.ndarray:
    """`(T,)` int64 token types of a prefix-LM row: 0 before the first trained token (attended both ways), 1 from it.

    >>> prefix_token_types(np.array([False, False, True, False, True])).tolist()
    [0, 0, 1, 1, 1]
    """
    return (np.cumsum(trained) > 0).astype(np.int64)


def expand_spans(spans: np.ndarray, replacements: list[dict]) -> np.ndarray:
    """Character spans of the rendered text moved into the text the processor expanded.

    Args:
        spans (`np.ndarray` of shape `(S, 2)`, int64): `[start, end)` spans of the rendered text, none inside a
            placeholder.
        replacements (`list[dict]`): the processor's `text_replacement_offsets` of the row, in text order: each
            placeholder's `"span"` in the rendered text and `"new_span"` in the expanded one.

    Returns:
        `np.ndarray` of shape `(S, 2)`, int64: each position shifted by the characters the placeholders before it
        gained.

    >>> expand_spans(np.array([[0, 2], [9, 12]]), [{"span": (4, 7), "new_span": (4, 13)}]).tolist()
    [[0, 2], [15, 18]]
    """
    ends = np.array([r["span"][1] for r in replacements], dtype=np.int64)
    # A placeholder ending at `end` shifts every later position by new_end - end (the gains so far, summed).
    shift = np.array([0] + [r["new_span"][1] - r["span"][1] for r in replacements], dtype=np.int64)
    return spans + shift[np.searchsorted(ends, spans, side="right")]
