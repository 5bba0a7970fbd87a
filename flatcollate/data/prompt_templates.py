"""Prompt templates for instruction data: `{query}` (and optionally `{input}`) become the prompt text.

Built in: `"alpaca"`, `"qa"`, `"none"`. A user template is a string with `{query}`, a dict with `"prompt"` (and
optionally `"prompt_no_input"`, used when the input field is empty), or a path to a `.txt` or `.json` file holding one
of those.
"""

import json
import string
from pathlib import Path

from .._paths import expand_path

BUILTIN_TEMPLATES: dict[str, dict[str, str]] = {
    "alpaca": {
        "prompt": (
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{query}\n\n### Input:\n{input}\n\n### Response:\n"
        ),
        "prompt_no_input": (
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\n{query}\n\n### Response:\n"
        ),
    },
    "qa": {"prompt": "Question: {query}\n{input}\nAnswer: ", "prompt_no_input": "Question: {query}\nAnswer: "},
    "none": {"prompt": "{query}\n{input}", "prompt_no_input": "{query}"},
}


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def load_template(template: str | dict | Path) -> dict[str, str]:
    """Resolve a template name, string, dict or file to `{"prompt": ..., "prompt_no_input": ...}`.

    >>> load_template("Q: {query}\\nA: ")["prompt_no_input"]
    'Q: {query}\\nA: '
    >>> load_template("Answer this.")
    Traceback (most recent call last):
    ...
    ValueError: prompt template 'Answer this.' has no {query} placeholder; fields allowed: {query}, {input}.
    """
    if isinstance(template, str) and template in BUILTIN_TEMPLATES:
        return dict(BUILTIN_TEMPLATES[template])
    if isinstance(template, Path) or (isinstance(template, str) and template.endswith((".txt", ".json"))):
        path = expand_path(template)
        if not path.is_file():
            raise ValueError(f"prompt template file {path} does not exist.")
        text = path.read_text()
        template = json.loads(text) if path.suffix == ".json" else text
    if isinstance(template, str):
        template = {"prompt": template}
    if not isinstance(template, dict) or not isinstance(template.get("prompt"), str):
        raise TypeError(
            f"template must be one of {sorted(BUILTIN_TEMPLATES)}, a string with {{query}}, a dict with 'prompt', "
            f"or a .txt/.json file; got {template!r:.80}."
        )
    resolved = {"prompt": template["prompt"], "prompt_no_input": template.get("prompt_no_input", template["prompt"])}
    for key, text in resolved.items():
        fields = _fields(text)
        if "query" not in fields or not fields <= {"query", "input"}:
            raise ValueError(
                f"prompt template {text!r:.80} has no {{query}} placeholder; fields allowed: {{query}}, {{input}}."
                if "query" not in fields
                else f"prompt template {key} uses unknown fields {sorted(fields - {'query', 'input'})}."
            )
    return resolved


def render_prompt(template: dict[str, str], query: str, input_text: str = "") -> str:
    """Prompt text for one example.

    >>> render_prompt(load_template("qa"), "2 + 2?")
    'Question: 2 + 2?\\nAnswer: '
    """
    key = "prompt" if input_text else "prompt_no_input"
    return template[key].format(query=query, input=input_text)
