"""Model types the tables do not list (a transformers release newer than the one they were generated with) are
decided from their modules: every one that builds as a tiny model is exact or refused with its reason, never
contaminated. On the release the tables list, there are none."""

import importlib.util
from pathlib import Path

import pytest

from flatcollate.check import check_model

ROOT = Path(__file__).resolve().parents[1]


def _architectures() -> list[str]:
    spec = importlib.util.spec_from_file_location("compat_matrix", ROOT / "tools" / "compat_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.architectures()


def _listed() -> set[str]:
    text = (ROOT / "docs" / "compatibility.md").read_text().split("## Image-text-to-text architectures")[0]
    return {line.strip("|").split("|")[0].strip() for line in text.splitlines() if line.startswith("| ")}


UNLISTED = sorted(set(_architectures()) - _listed())


@pytest.mark.parametrize("model_type", UNLISTED)
def test_an_unlisted_architecture_is_exact_or_refused(model_type):
    report = check_model(model_type, backends=("flatcollate",))
    result = report.results[0]
    assert result.status in ("exact", "unsupported"), f"{model_type}: {result}"
    if result.status == "unsupported":
        assert result.reason


def test_the_listed_architectures_are_read_from_the_table():
    assert {"llama", "mamba", "falcon"} <= _listed()
