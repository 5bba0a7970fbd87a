"""Model FLOPs and MFU against hand counts; benchmark models are built on their device; the warm-up is bounded."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from flatcollate.bench import timing
from flatcollate.bench.build import build_on_device, model_config
from flatcollate.bench.config import SFTBenchConfig
from flatcollate.bench.flops import attention_width, linear_parameters, mfu, peak_flops, training_flops
from flatcollate.bench.tasks import sft
from flatcollate.testing import tiny_config


def test_training_flops_of_a_tiny_llama_by_hand():
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": False}
    config = tiny_config("llama", **sizes, **heads)
    model = AutoModelForCausalLM.from_config(config)
    # per layer: q 32x32, k 32x16, v 32x16, o 32x32, gate/up 32x64 each, down 64x32; then the LM head 32x100
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64
    assert linear_parameters(model) == 2 * per_layer + 32 * 100
    assert attention_width(config) == (2, 32)
    lengths = [5, 1, 10]
    expected = 6 * (2 * per_layer + 3200) * 16 + 6 * 2 * 32 * (25 + 1 + 100)
    assert training_flops(linear_parameters(model), 2, 32, lengths) == expected


def test_packing_one_long_sequence_costs_more_attention_than_two_halves():  # the L**2 term is per sequence
    assert training_flops(0, 1, 8, [10]) == 2 * training_flops(0, 1, 8, [5, 5])


def test_mfu_and_peaks():
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")
    assert peak == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 PCIe", "bfloat16") == pytest.approx(756e12)
    assert mfu(peak * 0.5, 2.0, peak) == pytest.approx(0.25)
    assert mfu(1e12, 1.0, None) is None
    assert peak_flops("NVIDIA GeForce GTX 1080", "bfloat16") is None and peak_flops("AMD EPYC", "bfloat16") is None


def test_benchmark_models_are_built_on_their_device(monkeypatch):
    """A full-size model must not be initialised on the host and copied: construction runs under the target device."""
    seen = []
    original = AutoModelForCausalLM.from_config

    def recording(*args, **kwargs):
        seen.append(torch.get_default_device())
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", recording)
    config = model_config(SFTBenchConfig())
    model = build_on_device(AutoModelForCausalLM, config, device=torch.device("meta"), dtype="float32", seed=0)
    assert seen == [torch.device("meta")] and next(model.parameters()).device.type == "meta"
    model = build_on_device(AutoModelForCausalLM, tiny_config("llama"), device="cpu", dtype="bfloat16", seed=0)
    assert next(model.parameters()).dtype == torch.bfloat16 and model.training


def test_the_warm_up_is_bounded_in_time(monkeypatch):
    """Passes that never settle (a first step compiling for 50 s, later ones alternating) stop once the warm-up has
    taken MAX_SETTLE_SECONDS, and the first step is reported apart."""
    times = iter([[50.0, 5.0], [3.0, 3.0], [1.0, 1.0], [9.0, 9.0]])
    monkeypatch.setattr(timing, "run_pass", lambda *a, **k: {"step_s": next(times)})
    settled = timing.settle(None, [0, 1], device=torch.device("cpu"))
    assert settled == {"settle_passes": 2, "first_step_s": 50.0, "warm_up_s": 61.0}  # 4 passes without the bound


def test_free_memory_is_read_from_the_gpu_on_cuda(monkeypatch):
    from flatcollate.bench import options

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 * 2**30, 80 * 2**30))
    assert options.available_bytes("cuda") == 3 * 2**30
    assert options.available_bytes("cpu") > 0


@pytest.mark.parametrize("model_type", ["mamba2", pytest.param("lfm3", marks=pytest.mark.slow)])
def test_the_sft_bench_measures_state_carrying_families_in_every_mixer_mode(model_type):
    # mamba2 has no attention at all: built eager (no SDPA path), and its FLOPs count no attention width
    config = SFTBenchConfig(model=model_type, batch_size=3, max_length=64, steps=1, warmup_steps=0, tiny=True)
    for mode in ("padded", "flattened", "flattened_batched"):
        result = sft.measure(config, mode, torch.device("cpu"))
        assert result["losses"][0] > 0 and result["pass_flops"] > 0, (mode, result)
