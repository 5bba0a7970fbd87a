"""`flatcollate check` reaches what a config declares: derived lengths per mechanism, and a window off by one fails."""

import pytest

from flatcollate.attention import dispatch
from flatcollate.check import check_model
from flatcollate.check.lengths import SHRUNK_WINDOW, plan_check
from flatcollate.testing import tiny_config


@pytest.mark.parametrize(
    ("family", "overrides", "key", "size"),
    [
        ("mistral", {"sliding_window": 9}, "sliding_window", 9),
        ("gpt_neo", {}, "window_size", 256),
        ("llama4_text", {}, "attention_chunk_size", SHRUNK_WINDOW),  # 8192 in the config: shrunk
        ("gemma2", {}, "sliding_window", SHRUNK_WINDOW),  # 4096 in the config: shrunk
    ],
)
def test_derived_lengths_reach_every_window_with_a_length_one_and_an_odd_sequence(family, overrides, key, size):
    plan = plan_check(tiny_config(family, **overrides))
    assert max(plan.lengths) > size and 1 in plan.lengths and any(n % 2 for n in plan.lengths if n > 1)
    assert plan.overrides.get(key, size) == size
    (line,) = [v for k, v in plan.exercised.items() if k.startswith(key)]
    assert line.startswith("yes")


def test_lengths_without_a_window_and_what_they_report():
    plan = plan_check(tiny_config("llama"))
    assert plan.lengths == (7, 1, 12, 4) and plan.overrides == {}
    assert plan.exercised["window / chunk"] == "not in config"
    assert plan_check(tiny_config("mamba2"), stateful=True).exercised["state-carrying layers"].startswith("yes")


def test_given_lengths_that_miss_the_window_are_reported_as_proving_nothing_about_it():
    plan = plan_check(tiny_config("mistral", sliding_window=4096), lengths=(7, 1, 12, 4))
    assert plan.overrides == {}
    (line,) = [v for k, v in plan.exercised.items() if k.startswith("sliding_window")]
    assert line.startswith("NO")


def test_soft_capping_is_made_to_bite():
    plan = plan_check(tiny_config("gemma2"))
    assert plan.overrides["attn_logit_softcapping"] == 1.0
    assert plan.exercised["soft-capping"].startswith("yes")


@pytest.mark.slow
@pytest.mark.parametrize("shift", [1, -1])
def test_a_window_off_by_one_in_the_packed_kernel_fails_the_check(monkeypatch, shift):
    config = tiny_config("mistral", sliding_window=4096)  # a real-size window, as in Mistral's own config
    assert check_model(config, backends=("flatcollate",)).passed
    kernel = dispatch.KERNELS["sdpa"]

    def off_by_one(*args, window=None, **kwargs):
        return kernel(*args, window=None if window is None else window + shift, **kwargs)

    monkeypatch.setitem(dispatch.KERNELS, "sdpa", off_by_one)
    (result,) = check_model(config, backends=("flatcollate",)).results
    assert result.status == "contaminated"
    # The lengths a check used before (no sequence reaches the window) cannot see the mutation.
    assert check_model(config, backends=("flatcollate",), lengths=(7, 1, 12, 4)).passed


def test_chunked_attention_is_exact_once_a_sequence_passes_the_chunk():
    # Llama 4's chunked layers are expressed only through transformers' masks; the packed backend cuts sequences
    # into chunks itself. Lengths below the chunk (as checks used before) could not tell.
    report = check_model("llama4_text", backends=("flatcollate",))
    assert max(report.lengths) > report.overrides["attention_chunk_size"]
    assert report.passed, report.to_markdown()


def test_deepseek_v4_compressed_attention_is_refused_with_its_reason():
    (result,) = check_model("deepseek_v4", backends=("flatcollate",)).results
    assert result.status == "unsupported" and "compress" in result.reason
