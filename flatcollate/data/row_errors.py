"""Rows that cannot be encoded: one exception type carrying a reason, and the value a skipping encoder returns.

`on_error="raise"` (the default everywhere) raises `RowError`; `on_error="skip"` makes the encoder return a
`SkippedRow` instead, which callers count by `reason` and report. Reasons:

| reason                   | the row                                                                          |
|--------------------------|----------------------------------------------------------------------------------|
| `not_a_dict`             | is not a mapping of fields                                                       |
| `unknown_format`         | has none of the fields that name a format                                        |
| `missing_field`          | lacks a field its format needs                                                   |
| `wrong_type`             | has a field of the wrong type (also a `TypeError`)                               |
| `empty_field`            | has an empty prompt, query or answer text                                        |
| `bad_message`            | has a conversation that is not a list of `{"role", "content": str}` dicts        |
| `unknown_role`           | has a message role outside `system`, `user`, `assistant`, `tool`                 |
| `no_assistant`           | has a conversation with no assistant message: nothing to train on                |
| `ends_without_reply`     | has a conversation whose last message is not the assistant's                     |
| `no_chat_template`       | is a conversation but the tokenizer has no chat template                         |
| `template_error`         | was refused by the chat template (e.g. roles that do not alternate)              |
| `template_drops_content` | has a message the chat template does not render, or renders out of order, or     |
|                          | a reply whose reasoning (`reasoning_content`) it does not render                 |
| `template_rewrites_history` | has a reply the template renders differently once later messages follow, so what |
|                          | the model generates for it cannot be read off the template                       |
| `template_splits_reply`  | has a tool-calling reply whose content the template writes outside the reply     |
|                          | (Diffusion-Gemma: after the tool responses), so what is generated is unknown     |
| `nothing_to_train`       | renders no token inside an assistant reply                                       |
| `image_count`            | has a different number of `{"type": "image"}` parts and images                   |
| `missing_image`          | names an image file that does not exist                                          |
| `bad_image`              | has an image that is not an image, path or image dict, or a file PIL cannot read |
| `image_in_reply`         | has an image or video part in an assistant message                               |
| `video_count`            | has a different number of `{"type": "video"}` parts without frames and videos    |
| `bad_video`              | has a video that is not frames (a file path, another shape, frames of two sizes) |
| `no_video_processor`     | has a video but the processor takes none, or was built without its video        |
|                          | processor (`images_only`: transformers' video processors need torchvision)       |
| `processor_error`        | was refused by the processor (e.g. an image too narrow for its patch grid)       |
| `encode_error`           | made the template or tokenizer raise another error (a `TypeError` from a         |
|                          | template joining a list of content parts); the message names it                  |
"""

from dataclasses import dataclass

ON_ERROR = ("raise", "skip")


class RowError(ValueError):
    """A row the encoder cannot turn into `input_ids` and `labels`; the message names the row, field and fix.

    Args:
        message (`str`): the error text.
        reason (`str`): a short key from the table above, used to count skipped rows.
    """

    def __init__(self, message: str, *, reason: str):
        if "on_error" not in message:  # every row error names the option that skips such rows
            message += ' To count and skip such rows instead, pass on_error="skip".'
        super().__init__(message)
        self.reason = reason


class RowTypeError(RowError, TypeError):
    """A row or field of the wrong type (reason `not_a_dict` or `wrong_type`); also a `TypeError`."""

    def __init__(self, message: str, *, reason: str = "wrong_type"):
        super().__init__(message, reason=reason)


@dataclass(frozen=True)
class SkippedRow:
    """What an encoder built with `on_error="skip"` returns for a row it cannot encode.

    Args:
        index (`int`, *optional*): the row's index as passed to the encoder.
        reason (`str`): the `RowError` reason.
        message (`str`): the full error message.
    """

    index: int | None
    reason: str
    message: str


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR}.")
    return on_error
