"""The quick starts hold as written on a machine without the Hub: every python block of README.md's "Quick start" and
of docs/data.md's opening runs offline, in a fresh process, on the tiny models and synthetic rows the examples build;
the other docs whose opening block is a fragment of a bigger run name the example that runs it.

The blocks of one `###` section run as one script, in order, as a reader pastes them into one session. The fast
check reads each script for names it uses but never defines (a fragment's `model`, `tokenizer`, `...`); the slow
one runs it, with `HOME` and the working directory in a temporary folder.
"""

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"README.md": "## Quick start", "docs/data.md": None}
"""Doc -> the section whose python blocks run as written (None: the opening, before the doc's first `## `)."""
LINKED = {"docs/vision.md": "examples/vlm_padding_free.py", "docs/streaming.md": "examples/accelerate/train.py"}
"""Doc -> the example its opening names as the offline run of its opening block."""


def section(doc: str, heading: str | None) -> str:
    """The text of `heading` up to the next heading of its level or above (outside code blocks); the opening, before
    the doc's first `## `, when `heading` is None."""
    lines = (ROOT / doc).read_text().splitlines(keepends=True)
    level = 2 if heading is None else len(heading.split(" ")[0])
    start = 1 if heading is None else lines.index(heading + "\n") + 1  # after the doc's title, or the heading
    fenced, end = False, len(lines)
    for i in range(start, len(lines)):
        fenced ^= lines[i].startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", lines[i]):
            end = i
            break
    return "".join(lines[start:end])


def scripts() -> dict[str, str]:
    """`doc: subsection` -> the python blocks of that subsection (one script) for every `RUNNABLE` section."""
    found = {}
    for doc, heading in RUNNABLE.items():
        for part in re.split(r"^### ", section(doc, heading), flags=re.MULTILINE):
            blocks = re.findall(r"^```python\n(.*?)^```$", part, flags=re.MULTILINE | re.DOTALL)
            if blocks:
                found[f"{doc}: {part.splitlines()[0] if heading else 'opening'}"] = "\n".join(blocks)
    return found


def names(node: ast.AST, ctx: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def binds(node: ast.AST) -> set[str]:
    """Names a statement binds: assignments, imports, definitions."""
    found = names(node, ast.Store)
    for n in ast.walk(node):
        if isinstance(n, ast.Import | ast.ImportFrom):
            found |= {(alias.asname or alias.name).split(".")[0] for alias in n.names}
        elif isinstance(n, ast.FunctionDef | ast.ClassDef):
            found.add(n.name)
    return found


def local(node: ast.AST) -> set[str]:
    """Names bound inside a statement for its own use: comprehension targets, arguments."""
    found = {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}
    for n in ast.walk(node):
        if isinstance(n, ast.comprehension):
            found |= names(n.target, ast.Store)
    return found


def undefined_names(script: str) -> set[str]:
    """Names the script reads before it binds them (top-level statements in order; a function's body against every
    name the script binds), and `...` where it stands for code."""
    tree = ast.parse(script)
    bound, missing, bodies = set(dir(builtins)), set(), []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef):
            bodies.append(statement)
        else:
            missing |= names(statement, ast.Load) - bound - local(statement)
        bound |= binds(statement)
    for body in bodies:
        missing |= names(body, ast.Load) - bound - binds(body) - local(body)
    dots = any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree))
    return missing | ({"..."} if dots else set())


SCRIPTS = scripts()


def test_the_runnable_sections_hold_the_quick_starts():
    assert sorted(SCRIPTS) == [
        "README.md: Completion-only training",
        "README.md: TRL `SFTTrainer`",
        "README.md: `transformers.Trainer`",
        "docs/data.md: opening",
    ]


def test_a_fragment_is_caught():
    fragment = "from x import prepare\nmodel = prepare(model)\nargs = Arguments(...)\n"
    assert undefined_names(fragment) == {"model", "Arguments", "..."}
    assert undefined_names("import numpy as np\nx = [y for y in np.arange(3)]\ndef f(a):\n    return a + x\n") == set()


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_quick_start_defines_what_it_uses(name):
    assert undefined_names(SCRIPTS[name]) == set(), f"{name} is a fragment: define these or link an example"


@pytest.mark.parametrize(("doc", "example"), LINKED.items())
def test_the_other_openings_name_the_example_that_runs_them(doc, example):
    assert f"`{example}`" in section(doc, None)
    assert (ROOT / example).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_quick_start_runs_as_written_offline(name, tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(home)}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPTS[name]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"{name}:\n{run.stderr[-3000:]}"
    assert "~" not in os.listdir(cwd)
    if "cache_dir=" in SCRIPTS[name]:
        assert list((home / ".cache" / "flatcollate").glob("supervised-*.arrow"))
