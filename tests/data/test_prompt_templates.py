"""Prompt templates given as files: a `.txt` file is the prompt, a `.json` file a `{"prompt", "prompt_no_input"}`
dict, both checked like a template given inline; a missing file, or a file that holds no template, is refused with
what to pass instead."""

import json

import pytest

from flatcollate.data.prompt_templates import load_template, render_prompt


def test_a_txt_file_is_the_prompt_and_a_json_file_the_dict(tmp_path):
    (tmp_path / "mine.txt").write_text("Q: {query}\n{input}\nA: ")
    (tmp_path / "mine.json").write_text(
        json.dumps({"prompt": "Q: {query} ({input})\nA: ", "prompt_no_input": "Q: {query}\nA: "})
    )
    from_txt = load_template(tmp_path / "mine.txt")
    assert from_txt == {"prompt": "Q: {query}\n{input}\nA: ", "prompt_no_input": "Q: {query}\n{input}\nA: "}
    from_json = load_template(str(tmp_path / "mine.json"))  # a path given as text, by its suffix
    assert render_prompt(from_json, "2+2?", "") == "Q: 2+2?\nA: "
    assert render_prompt(from_json, "2+2?", "in words") == "Q: 2+2? (in words)\nA: "


def test_a_missing_file_and_a_file_without_a_template_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"prompt template file .*nothing.txt does not exist"):
        load_template(tmp_path / "nothing.txt")
    (tmp_path / "list.json").write_text('["Q: {query}"]')
    with pytest.raises(TypeError, match=r"a dict with 'prompt', or a \.txt/\.json file; got"):
        load_template(tmp_path / "list.json")
    (tmp_path / "no_query.txt").write_text("Answer: ")
    with pytest.raises(ValueError, match=r"has no \{query\} placeholder"):
        load_template(tmp_path / "no_query.txt")
