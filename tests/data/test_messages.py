"""Every malformed message of a conversation is refused by `check_messages` with the row, the message index, what is
wrong and the option that skips such rows; a well-formed conversation with tool calls and reasoning passes (the
control of each case: the same message, repaired)."""

import pytest

from flatcollate.data import RowError
from flatcollate.data.messages import check_messages

CALL = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        ({"role": "assistant", "content": None, "tool_calls": "lookup"}, "'tool_calls' must be a list"),
        ({"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}, "tool call 0 needs a"),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "lookup", "arguments": "{x"}}],
            },
            "not valid JSON",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "lookup", "arguments": 3}}],
            },
            "must be a dict or JSON string",
        ),
        ({"role": "assistant"}, "'content' is missing"),
        ({"role": "assistant", "content": 7}, "'content' must be a string or a list"),
        ({"role": "assistant", "content": "ok", "reasoning_content": ["step"]}, "'reasoning_content' must be a string"),
        ("assistant: ok", "expected a dict with 'role' and 'content'"),
    ],
)
def test_a_malformed_reply_names_the_row_the_message_and_the_fix(reply, fragment):
    with pytest.raises(RowError, match="row 3, message 1") as caught:
        check_messages([USER, reply], where="row 3")
    assert fragment in str(caught.value) and 'on_error="skip"' in str(caught.value)
    assert caught.value.reason == "bad_message"


def test_only_an_assistant_message_carries_tool_calls():
    with pytest.raises(RowError, match="message 0: only assistant messages carry 'tool_calls'"):
        check_messages([{**USER, "tool_calls": [CALL]}, {"role": "assistant", "content": "ok"}], where="row 0")


def test_the_repaired_messages_pass():
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "assistant", "content": "ok", "reasoning_content": "step"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    for reply in replies:
        assert check_messages([USER, reply], where="row 3")[1] == reply
