"""`check_model` and `flatcollate check` on image-text-to-text families: a flattened image-text batch against each
example alone, for transformers' own SDPA and for a prepared model; families without a tiny recipe say why."""

import json

import pytest
import torch

from flatcollate.check import check_model
from flatcollate.check.vision import image_text_model_type, not_built_reason
from flatcollate.cli import main
from flatcollate.testing import tiny_vision as tiny
from flatcollate.testing.tiny_vision import FAMILIES, TINY_BUILD_NOTES, tiny_vision_lm

pytestmark = pytest.mark.slow

TOL = 1e-5


def _statuses(report):
    return {r.backend: r.status for r in report.results}


def test_qwen2_vl_is_exact_prepared_and_contaminated_vanilla():
    report = check_model("qwen2_vl", backends=("sdpa", "flatcollate"))
    assert _statuses(report) == {"sdpa": "contaminated", "flatcollate": "exact"}, report.to_markdown()
    vanilla, prepared = report.results
    assert vanilla.logits_diff > 1e-3  # one mRoPE numbering over the whole row moves every later sequence
    assert max(prepared.logits_diff, prepared.loss_diff, prepared.grad_diff) <= TOL
    assert report.model_type == "qwen2_vl" and len(report.lengths) == 3 and "images" in report.exercised
    assert "the logits move by" in report.exercised["images reversed across examples (control)"]
    assert report.exercised["image-path gradients (control)"] == "19 of 19 parameters get one"


def test_a_family_whose_logits_ignore_its_images_is_unverified(monkeypatch):
    """Gemma 3 as transformers initialises it (`mm_input_projection_weight` at zero) ignores its pixels: its flattened
    batch agrees with each example alone whether or not the images reached their sequences, so it is not `exact`."""
    monkeypatch.setattr(tiny, "WEIGHT_NOISE", 0.0)
    report = check_model("gemma3", backends=("flatcollate",))
    (result,) = report.results
    assert result.status == "unverified" and not report.passed, report.to_markdown()
    assert max(result.logits_diff, result.loss_diff, result.grad_diff) <= 1e-4  # agreement alone proves nothing
    assert result.reason.startswith("blind to its images: reversing them across examples moves the logits by 0.0e+00")
    assert "vision-tower or projector parameters get no gradient" in result.reason


@pytest.mark.parametrize(("family", "vanilla"), [("gemma3", "contaminated"), ("llava", "exact")])
def test_gemma3_and_llava(family, vanilla):
    report = check_model(family, backends=("sdpa", "flatcollate"))
    assert _statuses(report) == {"sdpa": vanilla, "flatcollate": "exact"}, report.to_markdown()


@pytest.mark.parametrize(
    ("family", "vanilla"),
    [
        # Its short convolutions refuse a packed row without the `causal_conv1d` kernel.
        ("lfm2_vl", "unsupported"),
        # Its sparse-attention indexer reads the attention mask: it keeps transformers' SDPA (`Family.own_backend`).
        ("mistral_large4", "exact"),
    ],
)
def test_families_whose_processor_pads_images_are_collated_as_it_pads_them(family, vanilla):
    """Their examples' images differ in patches (LFM2-VL) or height and width (Pixtral in Mistral Large 3): padded to
    a common shape, the prepared model is exact."""
    report = check_model(family, backends=("sdpa", "flatcollate"))
    assert _statuses(report) == {"sdpa": vanilla, "flatcollate": "exact"}, report.to_markdown()


NOT_BUILT = "vision-encoder-decoder"  # an encoder-decoder: no tiny image-text-to-text recipe


@pytest.fixture
def no_note(monkeypatch):
    """The family without a build note, so its reason is the fallback."""
    monkeypatch.delitem(TINY_BUILD_NOTES, NOT_BUILT, raising=False)


def test_a_family_without_a_tiny_recipe_is_reported_not_built(monkeypatch, no_note):
    assert NOT_BUILT not in FAMILIES and image_text_model_type(NOT_BUILT) == NOT_BUILT
    reason = not_built_reason(NOT_BUILT)
    assert reason == "not built as a tiny model: no tiny recipe"
    report = check_model(NOT_BUILT, backends=("sdpa", "flatcollate"))
    assert [(r.status, r.reason) for r in report.results] == [("unsupported", reason)] * 2
    assert not report.passed
    monkeypatch.setitem(TINY_BUILD_NOTES, NOT_BUILT, "config: no text_config")
    assert not_built_reason(NOT_BUILT) == "not built as a tiny model: config: no text_config"


def test_text_models_and_recipes_are_told_apart():
    assert image_text_model_type("llama") is None
    assert not_built_reason("qwen2_vl") is None


def test_a_folder_with_an_image_text_config_is_checked_by_its_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    assert image_text_model_type(str(tmp_path)) == "llava"


def test_lengths_and_overrides_do_not_apply_to_image_text_families():
    with pytest.raises(ValueError, match=r"qwen2_vl.*lengths.*tiny_vision_examples"):
        check_model("qwen2_vl", lengths=(3, 4))
    with pytest.raises(ValueError, match=r"qwen2_vl.*overrides"):
        check_model("qwen2_vl", overrides={"sliding_window": 4})
    with pytest.raises(ValueError, match=r"qwen2_vl.*dtype=torch.bfloat16"):
        check_model("qwen2_vl", dtype=torch.bfloat16)


def test_a_built_image_text_model_is_refused_with_its_model_type():
    with pytest.raises(TypeError, match="pass its model_type 'llava'"):
        check_model(tiny_vision_lm("llava"))


def test_cli_exit_status(capsys):
    assert main(["check", "qwen2_vl", "--backends", "sdpa", "flatcollate"]) == 0
    out = capsys.readouterr().out
    assert "| sdpa | contaminated |" in out and "| flatcollate | exact |" in out
    assert "verdict: qwen2_vl is safe with flatcollate" in out
    assert main(["check", "qwen2_vl", "--backends", "sdpa", "flatcollate", "--require-all-backends"]) == 1
    assert "verdict: qwen2_vl is NOT safe on every checked backend: sdpa contaminated" in capsys.readouterr().out


def test_cli_family_without_a_tiny_recipe(capsys, no_note):
    code = main(["check", NOT_BUILT])
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    assert f"verdict: {NOT_BUILT} was not checked: not built as a tiny model: no tiny recipe." in captured.out


def test_cli_lengths_are_a_usage_error_for_image_text_families(capsys):
    assert main(["check", "llava", "--lengths", "3", "4"]) == 2
    err = capsys.readouterr().err
    assert "--lengths" in err and "llava" in err and "Traceback" not in err
