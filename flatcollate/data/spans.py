"""Character spans of trained text in a rendered example, and the tokens that overlap them.

The label rule, shared by every format: a token is trained iff its characters overlap a trained span. A chat reply's
span runs from the first character of its content through the end-of-turn text the template writes after it
(`<|im_end|>\\n`, `<|eot_id|>`, `</s>`); a text answer's span is the completion (the EOS token is appended after it).
The header before a reply, `<|im_start|>assistant\\n` included, belongs to the prompt: inference starts after it.
Where the tokenizer merges prompt and reply characters into one token, that token carries reply text and is trained::

    text     <|im_start|>assistant\\n | \\n1. step<|im_end|>\\n        (reply "\\n1. step", Qwen2.5)
    span                             |-------------------------|
    tokens   <|im_start|> assistant  ĊĊ  1  .  Ġstep  <|im_end|>  Ċ
    trained        0          0      1   1  1    1        1       1
"""

import json

import numpy as np

from .row_errors import RowError


def tokens_in_spans(offsets: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which tokens overlap a span.

    Args:
        offsets (`np.ndarray` of shape `(T, 2)`, int64): `[start, end)` character offsets of each token.
        spans (`np.ndarray` of shape `(S, 2)`, int64): sorted, disjoint `[start, end)` character spans.

    Returns:
        `np.ndarray` of shape `(T,)`, bool: token `t` overlaps some span (`start < span_end` and `span_start < end`).
        Zero-width tokens (special tokens a post-processor adds, at `(0, 0)`) overlap nothing.

    >>> tokens_in_spans(np.array([[0, 3], [3, 5], [5, 9], [9, 9]]), np.array([[4, 6]])).tolist()
    [False, True, True, False]
    """
    trained = np.zeros(len(offsets), dtype=bool)
    if len(spans) == 0 or len(offsets) == 0:
        return trained
    starts, ends = offsets[:, 0], offsets[:, 1]
    # Spans are sorted and disjoint: a token overlaps some span iff it overlaps the first one ending after its start.
    j = np.searchsorted(spans[:, 1], starts, side="right")
    inside = j < len(spans)
    k = np.minimum(j, len(spans) - 1)
    return inside & (spans[k, 0] < ends) & (starts < ends)


def _variant_groups(content: str):
    yield tuple(dict.fromkeys((content, content.strip())))
    yield (json.dumps(content, ensure_ascii=False),)  # lazily: only reached when the text is not there as given


def find_content(text: str, content: str, pos: int, before: str, after: str) -> tuple[int, int] | None:
    """Earliest `[start, end)` of `content` at or after `pos`, preferring a match framed by `before` and `after`.

    Content is looked for as given or trimmed (Llama-3's `| trim`), then as JSON (`| tojson`, Llama-3.2 tool results).
    """
    frames = tuple(dict.fromkeys(((before, after), ("", after), ("", ""))))
    for variants in _variant_groups(content):
        for b, a in frames:
            found = [(i + len(b), v) for v in variants if (i := text.find(b + v + a, pos)) >= 0]
            if found:
                start, value = min(found, key=lambda f: f[0])
                return start, start + len(value)
    return None


def _describe(k: int, message: dict) -> str:
    return f"message {k} ({message['role']}, {message['content'][:20]!r})"


def reply_spans(text: str, messages: list[dict], *, reply_prefix: str, reply_suffix: str, where: str) -> np.ndarray:
    """Character spans of the assistant replies in a rendered conversation.

    Every message's content is searched in order, each search starting where the previous message ended, so a
    template that drops or reorders a message is caught. A reply is matched preferably right after `reply_prefix`
    (the template's generation prompt) and right before `reply_suffix` (its end-of-turn text); its span then extends
    over the part of `reply_suffix` that follows it in `text`.

    Args:
        text (`str`): the rendered conversation.
        messages (`list[dict]`): `{"role", "content"}` messages, as rendered.
        reply_prefix (`str`), reply_suffix (`str`): what the template writes before and after a reply.
        where (`str`): row and field, for error messages.

    Returns:
        `np.ndarray` of shape `(number of assistant messages, 2)`, int64: sorted, disjoint `[start, end)` spans.

    Raises:
        `RowError` (reason `template_drops_content`): a message is not in `text` after the previous one.

    >>> reply_spans("<u>hi</u><a>yo</a>", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    ...             reply_prefix="<a>", reply_suffix="</a>", where="row 0").tolist()
    [[12, 18]]
    """
    spans, pos = [], 0
    for k, message in enumerate(messages):
        content = message["content"]
        is_reply = message["role"] == "assistant"
        before, after = (reply_prefix, reply_suffix) if is_reply else ("", "")
        found = find_content(text, content, pos, before, after)
        if found is None:
            earlier = find_content(text, content, 0, "", "")
            problem = (
                f"is rendered before message {k - 1}" if earlier is not None else "is not in the rendered text"
            )
            raise RowError(
                f"{where}, {_describe(k, message)} {problem}: the chat template drops or reorders content, so the "
                "rendered conversation is not the data. Use a chat_template that renders every message in order, "
                "merge the message into one the template keeps, or pass on_error='skip'.",
                reason="template_drops_content",
            )
        start, end = found
        if is_reply:
            end = through_suffix(text, end, reply_suffix)
            spans.append((start, end))
        pos = end
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def through_suffix(text: str, end: int, reply_suffix: str) -> int:
    """`end` moved over the end-of-turn text (or the part of it) that follows a reply's content in `text`."""
    follows = text[end : end + len(reply_suffix)]
    return end + (len(follows) if follows == reply_suffix else len(_common_prefix(follows, reply_suffix)))


def _common_prefix(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]
