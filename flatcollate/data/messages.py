"""Checking a conversation before it is rendered: roles, contents, tool calls and reasoning fields.

A message is `{"role": "system" | "user" | "assistant" | "tool", "content": ...}` with, as transformers' chat
templates read them:

- `content`: a string, a list of parts (`{"type": "text", "text": ...}`, ...), or `None` / absent on an assistant
  message that carries `tool_calls` or reasoning;
- `tool_calls` (assistant): OpenAI format, `[{"type": "function", "function": {"name", "arguments"}}]` (the
  `function` wrapper may be left out), `arguments` a dict or a JSON string;
- `reasoning_content`, `thinking` or `reasoning` (assistant): a string, rendered by reasoning templates.

A key whose value is None is absent (`present_keys`), as `apply_chat_template` has it: mixed conversations stored as
Parquet or made with `Dataset.from_list` give every message (and every content part) every key, None where it has
none. Nothing else is rewritten, so `input_ids` are `apply_chat_template`'s.
"""

import json
from collections.abc import Mapping, Sequence

from .row_errors import RowError

ROLES = ("system", "user", "assistant", "tool")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def present_keys(messages):
    """The conversation without its None-valued keys, in each message and each content part (a key that holds None
    is absent, as `apply_chat_template` drops it from messages). Anything that is not a list of dicts is returned as
    is, for `check_messages` to name.

    >>> present_keys([{"role": "user", "content": [{"type": "text", "text": "hi", "image": None}], "name": None}])
    [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}]
    """
    if not isinstance(messages, list | tuple):
        return messages
    return [_without_none(m, parts=True) if isinstance(m, Mapping) else m for m in messages]


def _without_none(mapping: Mapping, *, parts: bool = False) -> dict:
    kept = {key: value for key, value in mapping.items() if value is not None}
    if parts and isinstance(kept.get("content"), list | tuple):
        kept["content"] = [_without_none(p) if isinstance(p, Mapping) else p for p in kept["content"]]
    return kept


def _bad(where: str, turn: int, problem: str, message) -> RowError:
    return RowError(f"{where}, message {turn}: {problem}, got {message!r:.100}.", reason="bad_message")


def _check_tool_calls(calls, *, where: str, turn: int) -> None:
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise _bad(where, turn, "'tool_calls' must be a list of {'type': 'function', 'function': {...}}", calls)
    for k, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise _bad(where, turn, f"tool call {k} needs a 'function' with a string 'name'", call)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                json.loads(arguments)
            except json.JSONDecodeError as err:
                raise _bad(
                    where,
                    turn,
                    f"tool call {k} ({function['name']}): 'arguments' is not valid JSON ({err.msg}); "
                    "pass a dict or a JSON string",
                    arguments,
                ) from err
        elif arguments is not None and not isinstance(arguments, Mapping):
            raise _bad(
                where, turn, f"tool call {k} ({function['name']}): 'arguments' must be a dict or JSON string", arguments
            )


def _check_message(message, *, where: str, turn: int) -> None:
    if not isinstance(message, Mapping) or "role" not in message:
        raise _bad(where, turn, "expected a dict with 'role' and 'content'", message)
    if message["role"] not in ROLES:
        raise RowError(
            f"{where}, message {turn}: role {message['role']!r} is not one of {ROLES}.", reason="unknown_role"
        )
    content = message.get("content")
    is_reply = message["role"] == "assistant"
    carries = is_reply and (message.get("tool_calls") or any(message.get(f) for f in REASONING_FIELDS))
    if content is None and not carries:
        raise _bad(
            where,
            turn,
            "'content' is missing (only an assistant message with tool_calls or reasoning may leave it out)",
            message,
        )
    parts = isinstance(content, Sequence) and all(isinstance(p, Mapping) and "type" in p for p in content)
    if content is not None and not isinstance(content, str) and not parts:
        raise _bad(where, turn, "'content' must be a string or a list of {'type': ...} parts", message)
    if message.get("tool_calls") is not None:
        if not is_reply:
            raise _bad(where, turn, "only assistant messages carry 'tool_calls'", message)
        _check_tool_calls(message["tool_calls"], where=where, turn=turn)
    for name in REASONING_FIELDS:
        if message.get(name) is not None and not isinstance(message[name], str):
            raise _bad(where, turn, f"{name!r} must be a string", message[name])


def check_messages(messages, *, where: str) -> list[dict]:
    """Validate a conversation: known roles, contents as above, at least one assistant message, ending on one.
    Empty contents are allowed: the template renders them like any other text.

    Raises:
        `RowError` with reason `bad_message`, `unknown_role`, `no_assistant` or `ends_without_reply`.

    >>> call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    >>> messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    >>> check_messages(messages, where="row 0")[1]["role"]
    'assistant'
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise RowError(f"{where} must be a non-empty list of messages, got {messages!r:.80}.", reason="bad_message")
    for turn, message in enumerate(messages):
        _check_message(message, where=where, turn=turn)
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError(f"{where}: no assistant message, so there is nothing to train on.", reason="no_assistant")
    if messages[-1]["role"] != "assistant":
        raise RowError(
            f"{where}: the last message ({len(messages) - 1}, {messages[-1]['role']}) is not an assistant reply; "
            "drop the turns after the last reply or pass on_error='skip'.",
            reason="ends_without_reply",
        )
    return list(messages)
