"""Finding a response/instruction template's token ids inside a sequence, and the label masks that follow.

Used by `DataCollatorForCompletionOnlyLM`. Prompt templates (rendering raw records to text) live in
`flatcollate.data.templates`.
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# Contexts a template string commonly follows; a template tokenized alone can differ from the same text in context
# (e.g. "\n### Response:" merges the newline into its first token), so each is tried as a variant.
_CONTEXTS = ("\n", " ", "\n\n", ": ")


def find_subsequence(sequence: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Start index of every occurrence of `pattern` in `sequence`, without a Python loop over tokens.

    Args:
        sequence (`np.ndarray` of shape `(L,)`, int64).
        pattern (`np.ndarray` of shape `(K,)`, int64), K >= 1.

    Returns:
        `np.ndarray` of shape `(M,)`, int64, ascending.

    >>> find_subsequence(np.array([1, 2, 3, 1, 2]), np.array([1, 2])).tolist()
    [0, 3]
    """
    k = len(pattern)
    if k == 0 or k > len(sequence):
        return np.zeros(0, dtype=np.int64)
    # Compare only windows whose first token matches, instead of all L x K entries.
    candidates = np.flatnonzero(sequence[: len(sequence) - k + 1] == pattern[0])
    if k == 1 or candidates.size == 0:
        return candidates.astype(np.int64)
    windows = sliding_window_view(sequence, k)[candidates]
    return candidates[(windows == pattern).all(axis=1)].astype(np.int64)


def find_any(sequence: np.ndarray, variants: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Occurrences of any of several tokenizations of one template: `(starts, ends)`, sorted by start.

    >>> starts, ends = find_any(np.array([7, 1, 2, 9, 3, 2]), [np.array([1, 2]), np.array([3, 2])])
    >>> starts.tolist(), ends.tolist()
    ([1, 4], [3, 6])
    """
    starts, ends = [], []
    for variant in variants:  # a handful of variants, each searched vectorized
        found = find_subsequence(sequence, variant)
        starts.append(found)
        ends.append(found + len(variant))
    start, end = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(start, kind="stable")
    return start[order], end[order]


def decoded_with_offsets(ids: np.ndarray, tokenizer) -> tuple[str, np.ndarray] | None:
    """The text of `ids` and each token's `[start, end)` characters in it, from a fast tokenizer: the ids are decoded,
    the text tokenized again with offsets, and used where that gives `ids` back (else `None`: ids that are not the
    tokenizer's own encoding of a text are searched by id).

    Returns:
        `(text, offsets)`, offsets `np.ndarray` of shape `(L, 2)`, int64; or `None`.
    """
    if not getattr(tokenizer, "is_fast", False):
        return None
    text = tokenizer.decode(ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if encoding["input_ids"] != ids.tolist():
        return None
    return text, np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)


def find_in_text(text: str, offsets: np.ndarray, template: str) -> tuple[np.ndarray, np.ndarray]:
    """Token `[start, end)` of every occurrence of `template` in `text`, whatever merges its neighbours cause: a token
    holding any of the template's characters belongs to it (Qwen2.5's `:\n` after `### Response:`)::

        text      ### Response:\nHi        template "### Response:"
        tokens    ### | ĠResponse | :Ċ | Hi
        match     [0, 3)

    >>> starts, ends = find_in_text("ab:|c", np.array([[0, 2], [2, 4], [4, 5]]), "ab:")
    >>> starts.tolist(), ends.tolist()
    ([0], [2])
    """
    found, at = [], text.find(template)
    while at >= 0:  # one iteration per occurrence, not per token
        found.append(at)
        at = text.find(template, at + 1)
    first = np.asarray(found, dtype=np.int64)
    ends = offsets[:, 1]
    return np.searchsorted(ends, first, side="right"), np.searchsorted(ends, first + len(template), side="left") + 1


def find_template(
    ids: np.ndarray,
    template: str | list[int],
    variants: list[np.ndarray],
    sequence_starts: np.ndarray,
    decoded: tuple[str, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Token `[start, end)` of a template's occurrences inside one sequence each: a string template by characters in
    the decoded text where `decoded` is given (`decoded_with_offsets`), else (ids, or ids a tokenizer does not give
    back from their text) by its token-id variants."""
    if isinstance(template, str) and decoded is not None:
        return within_sequences(*find_in_text(*decoded, template), sequence_starts)
    return within_sequences(*find_any(ids, variants), sequence_starts)


def matches_within_sequences(
    sequence: np.ndarray, variants: list[np.ndarray], sequence_starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`find_any`, keeping only the matches that lie inside one sequence of a packed example.

    Args:
        sequence (`np.ndarray` of shape `(L,)`, int64): the example's token ids.
        variants (`list[np.ndarray]`): tokenizations of one template.
        sequence_starts (`np.ndarray` of shape `(N,)`, int64): where each packed sequence starts, ascending, first 0.

    >>> starts, ends = matches_within_sequences(np.array([1, 2, 9, 1, 2]), [np.array([2, 9])], np.array([0, 2]))
    >>> starts.tolist()  # [2, 9] spans the boundary at 2
    []
    """
    return within_sequences(*find_any(sequence, variants), sequence_starts)


def within_sequences(
    starts: np.ndarray, ends: np.ndarray, sequence_starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The `[start, end)` token matches that lie inside one sequence of a packed example."""
    first = np.searchsorted(sequence_starts, starts, side="right")
    inside = first == np.searchsorted(sequence_starts, ends - 1, side="right")
    return starts[inside], ends[inside]


def sequences_without(positions: np.ndarray, sequence_starts: np.ndarray) -> np.ndarray:
    """Indices of the packed sequences that contain none of `positions`.

    >>> sequences_without(np.array([0, 5]), np.array([0, 3, 4])).tolist()
    [1]
    """
    found = np.searchsorted(sequence_starts, positions, side="right") - 1
    return np.setdiff1d(np.arange(len(sequence_starts)), found)


def completion_mask_after_last(
    length: int, response_ends: np.ndarray, sequence_starts: np.ndarray | None = None
) -> np.ndarray:
    """Single-turn rule: train only on tokens after the last response template of each sequence.

    Args:
        length (`int`): tokens in the example.
        response_ends (`np.ndarray` of shape `(M,)`, int64): where each response template ends, ascending.
        sequence_starts (`np.ndarray` of shape `(N,)`, int64, *optional*): starts of the packed sequences (default:
            one sequence). A sequence without a response template trains nothing.

    Returns:
        `np.ndarray` of shape `(length,)`, bool.

    >>> completion_mask_after_last(6, np.array([2, 4])).tolist()
    [False, False, False, False, True, True]
    >>> completion_mask_after_last(6, np.array([2, 5]), np.array([0, 3])).astype(int).tolist()
    [0, 0, 1, 0, 0, 1]
    """
    starts = np.zeros(1, dtype=np.int64) if sequence_starts is None else np.asarray(sequence_starts, dtype=np.int64)
    sequence_ends = np.append(starts[1:], length)
    last = np.full(len(starts), -1, dtype=np.int64)
    np.maximum.at(last, np.searchsorted(starts, response_ends - 1, side="right") - 1, response_ends)
    last = np.where(last < 0, sequence_ends, last)
    first_trained = np.repeat(last, sequence_ends - starts)
    return np.arange(length) >= first_trained


def completion_mask_turns(length: int, response_ends: np.ndarray, instruction_starts: np.ndarray) -> np.ndarray:
    """Multi-turn rule: train from the end of each response template up to the next instruction template.

    Every position takes the state of the last template seen at or before it (response opens, instruction closes)::

        tokens     U U R r r U U R r
        markers    - - + . . - - + .      (+ response end, - instruction start)
        trained    0 0 1 1 1 0 0 1 1

    >>> completion_mask_turns(9, np.array([2, 7]), np.array([0, 5])).astype(int).tolist()
    [0, 0, 1, 1, 1, 0, 0, 1, 1]
    """
    markers = np.zeros(length + 1, dtype=np.int8)
    markers[response_ends] = 1
    markers[instruction_starts] = -1  # an instruction right after a response template closes the (empty) span
    markers = markers[:length]
    last = np.where(markers != 0, np.arange(length), -1)
    np.maximum.accumulate(last, out=last)
    return (last >= 0) & (markers[np.maximum(last, 0)] == 1)


def template_variants(template: str | list[int] | np.ndarray, tokenizer) -> list[np.ndarray]:
    """Token-id sequences a template may appear as.

    Ids are used as given (the exact remedy when a string template does not match in context). A string is tokenized
    alone and after a few common contexts, keeping the part that follows the context's own tokens.
    """
    if not isinstance(template, str):
        ids = np.asarray(template, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("a template given as token ids must not be empty.")
        return [ids]
    if not template:
        raise ValueError("a template string must not be empty.")
    if tokenizer is None:
        raise ValueError(f"template {template!r} is a string, so a `tokenizer` is needed; or pass token ids.")
    variants = [tokenizer.encode(template, add_special_tokens=False)]
    for context in _CONTEXTS:
        context_ids = tokenizer.encode(context, add_special_tokens=False)
        with_context = tokenizer.encode(context + template, add_special_tokens=False)
        if with_context[: len(context_ids)] == context_ids and len(with_context) > len(context_ids):
            variants.append(with_context[len(context_ids) :])
    unique = {tuple(v) for v in variants if v}
    return [np.asarray(v, dtype=np.int64) for v in sorted(unique, key=lambda v: (-len(v), v))]
