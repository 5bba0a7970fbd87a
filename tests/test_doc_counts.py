"""The counts the docs quote equal the counts of the code and of the tables they describe, so a stale figure fails.

Counts come from the code where it holds them (transformers' image-text-to-text mapping, the tiny vision recipes, the
families of the image-text proof, the architectures `tools/compat_matrix.py` enumerates) and from the rows of the
generated tables in `docs/compatibility.md` for measured verdicts. Each quoted sentence is matched in the docs' text
with line breaks joined; a sentence reworded so that it no longer matches fails here too, and so does a count of
families or architectures in README.md or docs/ that no test below reads.
"""

import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from flatcollate.testing.vision_recipes import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COUNT = re.compile(r"\b\d+(?: of \d+)?\s+(?:[\w-]+\s+){0,3}?(?:families|architectures)\b")
"""A count of families or architectures in prose ("24 families", "97 image-text-to-text architectures")."""
SENTENCES: dict[str, tuple[str, str]] = {
    "text table": (
        "docs/compatibility.md",
        r"flatcollate is exact on (\d+) of (\d+) architectures that build \((\d+)%\); (\d+) more could not be built",
    ),
    "text in attention.md": (
        "docs/attention.md",
        r"of the (\d+) decoder-only text architectures whose tiny models build, vanilla `sdpa` is exact on (\d+) "
        r"\((\d+) contaminated\), vanilla `eager` on (\d+) \((\d+) contaminated\), and `flatcollate` on (\d+) "
        r"\((\d+)%, [^;]*; the other (\d+) are refused with their reason \([^)]*\) and none is contaminated",
    ),
    "image-text table": (
        "docs/compatibility.md",
        r"flatcollate exact on (\d+) of (\d+) families that build as tiny models \((\d+)%\); (\d+) of the (\d+) "
        r"families are not built",
    ),
    "image-text in vision.md": (
        "docs/vision.md",
        r"runs it on all (\d+) image-text-to-text architectures of transformers [\d.]+: flatcollate is exact on all "
        r"(\d+) that build as tiny models; vanilla transformers on (\d+) of them \((\d+) contaminated, (\d+) "
        r"refused\)\. The table, with the reason each of the other (\d+) was not built",
    ),
    "image-text proof": ("docs/vision.md", r"\(`tests/vision/test_flattened_exact\.py`, (\d+) families\)"),
    "image-text proof guarantee": (
        "docs/guarantees.md",
        r"on the (\d+) families of `tests/vision/test_flattened_exact\.py` \(`VANILLA`\) in the suite, and on all "
        r"(\d+) families with a tiny recipe in the generated table",
    ),
    "image-text controls guarantee": (
        "docs/guarantees.md",
        r"for every family the proof runs \(the (\d+) in the suite; all (\d+) in the table's controls column\)",
    ),
}
"""Every sentence of the docs quoting a count of families or architectures: doc, pattern (the counts its groups)."""


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose(name: str) -> str:
    """A doc's text with line breaks joined and markdown emphasis dropped."""
    return " ".join((ROOT / name).read_text().split()).replace("**", "")


def quoted(sentence: str) -> tuple[int, ...]:
    """The counts `SENTENCES[sentence]` quotes, from the one sentence of its doc that matches it."""
    name, pattern = SENTENCES[sentence]
    matches = list(re.finditer(pattern, prose(name)))
    assert len(matches) == 1, f"{name}: {len(matches)} sentences match {pattern!r}; reworded? change this test with it"
    return tuple(int(number) for number in matches[0].groups())


def table(section: str, header: str) -> dict[str, list[str]]:
    """First cell -> the other cells of the markdown table starting at `header` in `section`, statuses by first word."""
    lines = section[section.index(header) :].splitlines()[2:]
    end = next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))
    rows = [line.strip("|").split("|") for line in lines[:end]]
    return {cells[0].strip(): [cell.strip().split(" ")[0] for cell in cells[1:]] for cells in rows}


@pytest.fixture(scope="module")
def compatibility() -> dict[str, dict[str, list[str]]]:
    """The tables of docs/compatibility.md: text architectures, those not built, image-text families."""
    text, image_text = (DOCS / "compatibility.md").read_text().split("## Image-text-to-text architectures")
    return {
        "text": table(text, "| model_type | lengths |"),
        "not built": table(text, "| model_type | error |"),
        "image-text": table(image_text, "| family | vanilla transformers |"),
    }


def generated_with() -> str:
    """The transformers release docs/compatibility.md was generated with (its first paragraph says)."""
    return re.search(r"with transformers (\d[\w.]*)", (DOCS / "compatibility.md").read_text()).group(1)


def same_transformers():
    """The tables list the model types of the release they were generated with; on another release, the types it
    adds are decided from their modules (tests/test_unknown_architectures.py) and the tables are not compared."""
    if transformers.__version__ != generated_with():
        pytest.skip(
            f"docs/compatibility.md lists the model types of transformers {generated_with()}, this is "
            f"{transformers.__version__}; regenerate it with `python tools/compat_matrix.py` to compare"
        )


def percent(part: int, whole: int) -> int:
    return round(100 * part / whole)


def test_the_text_table_covers_every_architecture_the_tool_enumerates(compatibility):
    same_transformers()
    enumerated = load(ROOT / "tools" / "compat_matrix.py").architectures()
    assert sorted({*compatibility["text"], *compatibility["not built"]}) == enumerated


def test_text_counts_equal_the_table(compatibility):
    rows = compatibility["text"].values()
    sdpa, eager, prepared = (Counter(row[column] for row in rows) for column in (1, 2, 3))
    built, exact = len(rows), prepared["exact"]
    assert quoted("text table") == (exact, built, percent(exact, built), len(compatibility["not built"]))
    assert quoted("text in attention.md") == (
        built,
        sdpa["exact"],
        sdpa["contaminated"],
        eager["exact"],
        eager["contaminated"],
        exact,
        percent(exact, built),
        built - exact,
    )
    assert set(prepared) == {"exact", "unsupported"}  # "none is contaminated"


def test_image_text_counts_equal_the_code_and_the_table(compatibility):
    same_transformers()
    rows = compatibility["image-text"]
    families = len(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert set(rows) == set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    built = {family for family, (_, prepared, *_) in rows.items() if prepared != "not"}
    assert built == set(FAMILIES)  # a row for every tiny recipe, and no other
    exact = sum(rows[family][1] == "exact" for family in built)
    vanilla = Counter(rows[family][0] for family in built)
    assert quoted("image-text table") == (
        exact,
        len(FAMILIES),
        percent(exact, len(FAMILIES)),
        families - len(FAMILIES),
        families,
    )
    assert exact == len(FAMILIES)  # "exact on all N" below
    assert quoted("image-text in vision.md") == (
        families,
        len(FAMILIES),
        vanilla["exact"],
        vanilla["contaminated"],
        vanilla["unsupported"],
        families - len(FAMILIES),
    )


def test_the_image_text_proof_count_equals_its_families():
    proof = load(ROOT / "tests" / "vision" / "test_flattened_exact.py")
    assert quoted("image-text proof") == (len(proof.FAMILIES),)
    assert quoted("image-text proof guarantee") == quoted("image-text controls guarantee") == (
        len(proof.FAMILIES),
        len(FAMILIES),
    )
    assert set(proof.FAMILIES) <= set(FAMILIES)


def test_no_count_of_families_or_architectures_goes_unchecked():
    """Every such count in README.md and docs/ lies in a sentence of `SENTENCES`, which the tests above read."""
    names = ["README.md", *(f"docs/{path.name}" for path in sorted(DOCS.glob("*.md")))]
    unchecked = []
    for name in names:
        text = prose(name)
        spans = [m.span() for doc, pattern in SENTENCES.values() if doc == name for m in re.finditer(pattern, text)]
        for match in COUNT.finditer(text):
            if not any(start <= match.start() and match.end() <= end for start, end in spans):
                unchecked.append(f"{name}: {match.group(0)!r}")
    assert not unchecked, "counts no test reads (add them to tests/test_doc_counts.py): " + "; ".join(unchecked)
