"""Character spans of what the model generates in a rendered conversation, derived from the chat template itself.

The label rule for conversations: a token is trained iff the model generates it at inference. For assistant message
`i` that is everything the template renders for it after the generation prompt, through its end of turn: reasoning
(`<think>...</think>` from `reasoning_content`), content, tool calls, channel and recipient headers. It is read off
the template, never searched for::

    P_i  = render(messages[:i], add_generation_prompt=True)     the prompt the model sees at inference
    R_i  = render(messages[:i + 1])                              the same conversation with reply i written
    F    = render(messages)                                      the row, rendered and tokenized once
    span = [len(P_i), len(R_i))   when P_i and R_i are both prefixes of F

    F    <|im_start|>user\\nq<|im_end|>\\n<|im_start|>assistant\\n<tool_call>{...}</tool_call><|im_end|>\\n...
    P_1  |--------------------------------------------------|
    R_1  |------------------------------------------------------------------------------------|
    span                                                    |-----------------------------------|

`P_i` and `R_i` are strings only (rendered with the compiled template, not tokenized). Templates that render a turn
differently once the conversation goes on are handled as they render `F`:

- the generation prompt is not a prefix of `F` (DeepSeek-R1 prompts `<｜Assistant｜><think>\\n` but renders earlier
  turns without `<think>`): the span starts right after the part of the generation prompt that `F` keeps, as a
  probe conversation shows the template writes it before a reply in the history (`<｜Assistant｜>`), so a reply
  starting with `<` is trained from that `<`; without such a header, where `P_i` and `F` part, provided that is inside
  the generation prompt;
- `R_i` is not a prefix of `F` (gpt-oss ends a final turn with `<|return|>`, an earlier one with `<|end|>`; Qwen3
  drops the reasoning of turns before the last user message): the span ends where `render(messages[:i + 1],
  add_generation_prompt=True)` stops before the next generation prompt if that is a prefix of `F`; else, where `R_i`
  ends with the end of a final turn and `F` has the rest of `R_i` followed by the end of an earlier turn (both read
  off probe conversations; a template keying `<|return|>` on `loop.last` alone), right after that; else at the end of
  the longest tail of `R_i` that `F` has right where the two part.

Where not even `render([])` is a prefix of `F` (a template that writes the message count first), replies of plain
text are found by their content between the generation prompt and the end of turn, as before; others raise.
A system, user or tool message whose text is not in `F` after the previous message, and a reply whose reasoning
(`reasoning_content`, `thinking`, `reasoning`) is not in its span (Qwen2.5 and Mistral-Nemo render none, Qwen3 drops
that of earlier turns), raise `RowError` (`template_drops_content`). Anything else (an earlier turn rendered
differently in `P_i` than in `F`, a turn of which `F` keeps nothing) raises `RowError` naming the message: labels are
never guessed.
"""

from collections.abc import Callable

import jinja2
import numpy as np

from .messages import REASONING_FIELDS
from .row_errors import RowError
from .spans import find_content, through_suffix
from .turn_checks import check_content_inside, check_reasoning_inside, describe_message, rendered_after

Render = Callable[[list[dict], bool], str]  # (messages, add_generation_prompt) -> text


def common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (binary search on slices: C speed, no loop over chars).

    >>> common_prefix_length("abcx", "abcy")
    3
    """
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _try(render: Render, head: list[dict], add_generation_prompt: bool) -> str | None:
    """A prefix the template refuses (an empty conversation, one ending on a tool call) has no span to give."""
    try:
        return render(head, add_generation_prompt)
    except jinja2.TemplateError:
        return None


def _start(
    text: str, prompt: str | None, generation_prompt: str, history_header: str | None, floor: int, previous: dict | None
) -> int | None:
    if prompt is None:
        return None
    if text.startswith(prompt):
        start = len(prompt)
        if generation_prompt and not prompt.endswith(generation_prompt) and text.startswith(generation_prompt, start):
            # No generation prompt after a tool result (Diffusion-Gemma: the model goes on in its turn), but the row
            # writes the header there: the header is prompt, as everywhere.
            start += len(generation_prompt)
    else:
        start = common_prefix_length(prompt, text)
        at = len(prompt) - len(generation_prompt)  # where the generation prompt starts, in the prompt and the row
        if not prompt.endswith(generation_prompt) or start < at:
            # The conversation before the reply renders differently, not just the generation prompt.
            return _after_previous(text, prompt, generation_prompt, floor, previous)
        kept = history_header  # the header the history writes before a reply, where the probe could tell
        if kept is not None and generation_prompt.startswith(kept) and text.startswith(kept, at):
            # The row keeps only the header of the generation prompt (DeepSeek-R1: `<｜Assistant｜>` of
            # `<｜Assistant｜><think>\n`): the reply starts right after it, even where its first characters happen to
            # match what the prompt goes on with (a reply starting with `<`).
            start = at + len(kept)
    return start if start >= floor else None


def _after_previous(text: str, prompt: str, generation_prompt: str, floor: int, previous: dict | None) -> int | None:
    """Where the reply starts when an earlier turn renders differently in the prompt than in the row (gpt-oss renders
    a tool-calling turn's content as analysis while its tool results are the last messages, and drops it once a
    final reply follows): what the prompt writes after the message right before the reply (its end of turn and the
    generation prompt) must follow that message in the row too, at `floor`."""
    content = None if previous is None or previous["role"] == "assistant" else previous.get("content")
    if not isinstance(content, str) or not content or not generation_prompt or not prompt.endswith(generation_prompt):
        return None
    at = prompt.rfind(content)
    gap = prompt[at + len(content) :]
    return floor + len(gap) if at >= 0 and text.startswith(gap, floor) else None


def _end(
    text: str,
    reply: str | None,
    start: int,
    render: Render,
    head: list[dict],
    generation_prompt: str,
    ends: tuple[str, str],
) -> int | None:
    if reply is None:
        return None
    if len(reply) >= start and text.startswith(reply):
        return len(reply)
    if generation_prompt:
        continued = _try(render, head, True)  # the reply as a turn the conversation goes on from
        if continued is not None and continued.endswith(generation_prompt):
            continued = continued[: len(continued) - len(generation_prompt)]
            if len(continued) > start and text.startswith(continued):
                return len(continued)
    last_end, earlier_end = ends
    if last_end and earlier_end and reply.endswith(last_end):
        # The last reply ends its turn otherwise than earlier ones (`<|return|>` and `<|end|>`, keyed on `loop.last`):
        # the reply is followed in the row by the end of an earlier turn, which is the reply's.
        body = len(reply) - len(last_end)
        if body >= start and text.startswith(reply[:body]) and text.startswith(earlier_end, body):
            return body + len(earlier_end)
    part = common_prefix_length(reply, text)
    if part < start:
        return None
    tail = reply[part:]
    # Loop over the tail's characters (one turn, not the row): the longest tail of the reply `text` has at `part`.
    for k in range(len(tail)):
        if text.startswith(tail[k:], part):
            return part + len(tail) - k
    return part if part > start else None


def _searched(text: str, message: dict, floor: int, generation_prompt: str, end_of_turn: str) -> tuple[int, int] | None:
    """The fallback for a template whose prefixes are not prefixes of the row: a reply of plain text only is found by
    its content, framed by the generation prompt and end of turn, as `flatcollate.data.spans.reply_spans` does."""
    content = message.get("content")
    if not isinstance(content, str) or message.get("tool_calls") or any(message.get(f) for f in REASONING_FIELDS):
        return None  # reasoning, tool calls or parts: the content alone is not what the model generates
    found = find_content(text, content, floor, generation_prompt, end_of_turn)
    return None if found is None else (found[0], through_suffix(text, found[1], end_of_turn))


def _framed(text: str, message: dict, floor: int, gap: str | None, end_of_turn: str) -> tuple[int, int] | None:
    """The cheap check, for a reply between the first and the last after a user message: plain text written right at
    `floor` (the end of the user message) as `gap` (what the template wrote between the first reply read off its
    renders and the user message before it: end of turn and generation prompt), the content as given and the end of
    turn. That is the span a prefix-stable template's renders give; a reply that fails it (reasoning, tool calls,
    trimmed content, another end of turn, another header) pays its renders."""
    content = message.get("content")
    if gap is None or not end_of_turn or not isinstance(content, str):
        return None
    if message.get("tool_calls") or any(message.get(f) for f in REASONING_FIELDS):
        return None
    if not text.startswith(gap + content + end_of_turn, floor):
        return None
    start = floor + len(gap)
    return start, start + len(content) + len(end_of_turn)


def generated_spans(
    text: str,
    messages: list[dict],
    *,
    render: Render,
    generation_prompt: str,
    end_of_turn: str = "",
    history_header: str | None = None,
    earlier_end_of_turn: str = "",
    where: str,
    render_every_reply: bool = False,
) -> np.ndarray:
    """Character spans of the text the model generates for each assistant message of a rendered conversation.

    Args:
        text (`str`): `render(messages, False)`, the whole row.
        messages (`list[dict]`): the conversation.
        render (`Callable[[list[dict], bool], str]`): renders a conversation (prefix) with or without the generation
            prompt, as `text` was rendered (same template, tools and variables).
        generation_prompt (`str`): what the template appends for `add_generation_prompt=True` after a user turn.
        end_of_turn (`str`, *optional*): what it writes after a final reply (the search fallback looks for it).
        history_header (`str`, *optional*): what it writes before a reply's text where the reply is history, if known
            (`<｜Assistant｜>` where the generation prompt is `<｜Assistant｜><think>\\n`).
        earlier_end_of_turn (`str`, *optional*): what it writes after a reply that is not the last one, if known
            (`<|end|>` where `end_of_turn` is `<|return|>`).
        where (`str`): row and field, for error messages.
        render_every_reply (`bool`, *optional*): render the prefixes of every reply, also those between the first
            and the last that pass the cheap check (the slow reference the tests compare with).

    Returns:
        `np.ndarray` of shape `(number of assistant messages, 2)`, int64: sorted, disjoint `[start, end)` spans.

    Raises:
        `RowError` (reason `template_rewrites_history`): a reply's span cannot be read off the template.

    >>> def render(messages, add_generation_prompt):
    ...     text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
    ...     return text + ("<assistant>" if add_generation_prompt else "")
    >>> messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    >>> generated_spans(render(messages, False), messages, render=render, generation_prompt="<assistant>",
    ...                 where="row 0").tolist()
    [[26, 40]]
    """
    spans, floor = [], 0
    replies, gap = [i for i, m in enumerate(messages) if m["role"] == "assistant"], None
    # A pair of string renders per assistant message would cost the square of the chat's length (each render is the
    # whole prefix): the first reply after a user message and the last always pay them, others where the cheap
    # check fails.
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            floor = rendered_after(text, messages, i, floor, where)
            continue
        after_user = i > 0 and messages[i - 1]["role"] == "user"
        framed = None if render_every_reply or i == replies[-1] or not after_user else _framed(
            text, message, floor, gap, end_of_turn
        )
        if framed is not None:
            spans.append(framed)
            floor = framed[1]
            continue
        previous = messages[i - 1] if i else None
        start = _start(text, _try(render, messages[:i], True), generation_prompt, history_header, floor, previous)
        reply = None if start is None else _try(render, messages[: i + 1], False)
        end = _end(text, reply, start, render, messages[: i + 1], generation_prompt, (end_of_turn, earlier_end_of_turn))
        if end is None and not text.startswith(_try(render, [], False) or text[:1] + "\0"):
            # Not even the empty conversation is a prefix (a header that counts the messages): search plain replies.
            start, end = _searched(text, message, floor, generation_prompt, end_of_turn) or (start, None)
        if end is None:
            raise RowError(
                f"{where}, {describe_message(i, message)}: the chat template renders the conversation before or "
                "through this reply differently once later messages follow, so what the model generates for it cannot "
                "be read off the template. Use a chat_template that renders earlier turns as they were generated (e.g. "
                "TRL's *_training.jinja variants), split the conversation at this reply, or pass on_error='skip'.",
                reason="template_rewrites_history",
            )
        if gap is None and i > 0 and messages[i - 1]["role"] == "user":
            gap = text[floor:start]  # learnt from the first reply after a user message, read off the renders
        check_content_inside(text, messages, start, end, i, where)
        check_reasoning_inside(text, messages, start, end, i, where)
        spans.append((start, end))
        floor = end
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)
