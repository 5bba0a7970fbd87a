"""`tokens_in_spans` against a per-token loop, and `reply_spans` on hand-written renderings."""

import numpy as np
import pytest

from flatcollate.data import RowError
from flatcollate.data.spans import reply_spans, tokens_in_spans


def reference(offsets, spans):
    """Slow reference: a token is trained iff it overlaps a span (zero-width tokens overlap nothing)."""
    return [a < b and any(a < e and s < b for s, e in spans) for a, b in offsets]


def random_case(rng, num_tokens):
    widths = rng.integers(0, 5, num_tokens)  # zero-width tokens included
    ends = np.cumsum(widths)
    offsets = np.stack([ends - widths, ends], axis=1)
    population = int(ends[-1]) + 2
    size = min(2 * int(rng.integers(0, 6)), population - population % 2)
    cuts = np.sort(rng.choice(population, size=size, replace=False))
    return offsets, cuts.reshape(-1, 2)


@pytest.mark.parametrize("num_tokens", [1, 2, 97, 1025])
def test_tokens_in_spans_matches_the_loop(num_tokens):
    rng = np.random.default_rng(num_tokens)
    for _ in range(50):
        offsets, spans = random_case(rng, num_tokens)
        assert tokens_in_spans(offsets, spans).tolist() == reference(offsets.tolist(), spans.tolist())


def test_tokens_in_spans_edge_cases():
    offsets = np.array([[0, 2], [2, 4], [4, 6]])
    assert tokens_in_spans(offsets, np.zeros((0, 2), dtype=np.int64)).tolist() == [False] * 3
    assert tokens_in_spans(offsets, np.array([[0, 6]])).tolist() == [True] * 3
    assert tokens_in_spans(offsets, np.array([[2, 2]])).tolist() == [False] * 3  # an empty span
    assert tokens_in_spans(offsets, np.array([[3, 4]])).tolist() == [False, True, False]  # inside one token
    assert tokens_in_spans(offsets, np.array([[1, 5]])).tolist() == [True, True, True]  # straddles both ends
    assert tokens_in_spans(np.zeros((0, 2), dtype=np.int64), np.array([[0, 1]])).tolist() == []


def test_reply_spans_prefer_the_framed_match_and_extend_over_the_end_of_turn():
    # The reply "a" also occurs in "<a>" and in the user's text; only the framed one is the reply.
    text = "<u>a a</u><a>a</a><u></u><a></a>"
    messages = [
        {"role": "user", "content": "a a"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
    ]
    spans = reply_spans(text, messages, reply_prefix="<a>", reply_suffix="</a>", where="row 0")
    assert [text[s:e] for s, e in spans.tolist()] == ["a</a>", "</a>"]


def test_reply_spans_trimmed_and_json_contents():
    text = '[u]"say \\"hi\\""[a]hello[/a]'
    messages = [{"role": "tool", "content": 'say "hi"'}, {"role": "assistant", "content": "  hello\n"}]
    spans = reply_spans(text, messages, reply_prefix="[a]", reply_suffix="[/a]", where="row 0")
    assert [text[s:e] for s, e in spans.tolist()] == ["hello[/a]"]


def test_reply_spans_name_a_missing_message():
    with pytest.raises(RowError, match=r"row 2, message 1 \(user, 'gone'\) is not in the rendered text") as err:
        reply_spans(
            "<a>yo</a>",
            [{"role": "assistant", "content": "yo"}, {"role": "user", "content": "gone"}],
            reply_prefix="<a>",
            reply_suffix="</a>",
            where="row 2",
        )
    assert err.value.reason == "template_drops_content"
