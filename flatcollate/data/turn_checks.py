"""Checks of a rendered conversation against its messages, for `flatcollate.data.turns.generated_spans`: content the
chat template drops or reorders, a tool-calling reply written outside its turn, reasoning the template does not
render. Each raises `RowError` naming the row, the message and the fix; labels are never guessed."""

from .messages import REASONING_FIELDS
from .row_errors import RowError
from .spans import find_content


def rendered_after(text: str, messages: list[dict], i: int, pos: int, where: str) -> int:
    """Where prompt message `i` ends in `text`, searched from `pos`: a template that drops or reorders a message the
    model reads (Mistral-Nemo writes the system message into the last user turn only) is caught."""
    content = messages[i].get("content")
    if not isinstance(content, str):
        return pos  # content parts: the template decides how they read
    found = find_content(text, content, pos, "", "")
    if found is None:
        problem = "is rendered before message " + str(i - 1) if find_content(text, content, 0, "", "") else "is not in"
        problem = problem if problem != "is not in" else "is not in the rendered text"
        raise RowError(
            f"{where}, {describe_message(i, messages[i])} {problem}: the chat template drops or reorders content, so "
            "the rendered conversation is not the data. Use a chat_template that renders every message in order, "
            "merge the message into one the template keeps, or pass on_error='skip'.",
            reason="template_drops_content",
        )
    return found[1]


def describe_message(i: int, message: dict) -> str:
    content = message.get("content")
    shown = content[:20] if isinstance(content, str) else type(content).__name__
    return f"message {i} ({message['role']}, {shown!r})"


def check_content_inside(text: str, messages: list[dict], start: int, end: int, i: int, where: str) -> None:
    """A tool-calling reply whose own text the template writes after its span, before the next message that is not a
    tool result (Diffusion-Gemma writes it after the tool responses, inside the same turn), is refused: whether the
    model generates it there, after the environment's text, is not in the template's structure, and a span reaching
    it would train the tool's output. A content the row does not render at all (gpt-oss drops it once a final reply
    follows) is labelled as rendered."""
    message, content = messages[i], messages[i].get("content")
    if not message.get("tool_calls") or not isinstance(content, str) or not content.strip():
        return
    if content.strip() in text[start:end]:
        return
    later = next((m.get("content") for m in messages[i + 1 :] if m["role"] != "tool"), None)
    found = find_content(text, later, end, "", "") if isinstance(later, str) and later else None
    if content.strip() not in text[end : len(text) if found is None else found[0]]:
        return
    raise RowError(
        f"{where}, {describe_message(i, message)}: the chat template writes this tool-calling reply's content outside "
        "the reply (after the tool responses, in the same turn), so which of those characters the model generates "
        "cannot be read off the template. Put the text in a separate assistant message after the tool messages, "
        "leave the content of tool-calling messages empty, or pass on_error='skip'.",
        reason="template_splits_reply",
    )


def check_reasoning_inside(text: str, messages: list[dict], start: int, end: int, i: int, where: str) -> None:
    """A reply's reasoning (`reasoning_content`, `thinking`, `reasoning`) must be rendered inside its span: a template
    that renders none (Qwen2.5, Mistral-Nemo) or drops that of earlier turns (Qwen3's shipped template, before the last
    user message) would train the reply without it, and the reasoning would be lost without a word."""
    message = messages[i]
    for field in REASONING_FIELDS:
        reasoning = message.get(field)
        if not isinstance(reasoning, str) or not reasoning.strip():
            continue
        found = find_content(text, reasoning, start, "", "")
        if found is not None and found[1] <= end:
            continue
        raise RowError(
            f"{where}, {describe_message(i, message)}: its {field!r} is not in the rendered reply: the chat "
            "template drops the reasoning, so the reply would be trained without it. Use a chat_template that renders "
            "reasoning for every reply (e.g. TRL's qwen3_training.jinja), or remove the field to train the reply "
            "without it.",
            reason="template_drops_content",
        )
