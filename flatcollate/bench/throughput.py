"""Training throughput and peak memory of padded, padded-to-max, flattened and packed batches, measured in one run.

Every mode trains the same model from the same initial weights on the same synthetic sequences (drawn from a length
profile), for the same number of sequences. Repeats interleave the modes (the order rotates every repeat), so noise
from a shared machine hits all modes alike, and every ratio to `padded` is taken within one repeat. Each timed pass
starts after warm-up steps, from freshly reset weights and optimizer, so the loss curves of `padded` and `flattened`
must coincide: the JSON reports their largest difference.
"""

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

import flatcollate

from ..models import tiny_config
from .batches import MODES, default_pack_len, has_packing, real_tokens, slot_tokens, step_batches, synthetic_sequences
from .memory import PeakMemory
from .profiles import load_profile

CPU_MODEL = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
}
"""Default model sizes: small enough for a 2-core CPU, large enough that matrix products dominate Python overhead."""


@dataclass(frozen=True)
class ThroughputConfig:
    """What to measure.

    Args:
        model (`str`): a `model_type` (`"llama"`, `"qwen2"`) or a folder with a `config.json`.
        tiny (`bool`): shrink the config with `flatcollate.models.tiny_config` and apply `model_overrides`; `False`
            keeps the config's own sizes (with `model_overrides` applied), e.g. a 0.5B Qwen shape on a GPU.
        model_overrides (`dict`): config attributes to set.
        profile (`str`): a named length profile or a path (see `flatcollate.bench.load_profile`).
        batch_size (`int`): sequences per optimizer step in `padded`, `padded_max` and `flattened`.
        max_length (`int`): longer sequences are truncated to it (counted in the results); `padded_max` pads to it.
        steps (`int`): optimizer steps of one timed pass in the batch modes; `packed` trains on the same sequences.
        warmup_steps (`int`): untimed steps before every timed pass.
        repeats (`int`): timed passes per mode.
        modes (`tuple[str, ...]`): subset of `MODES`.
        pack_len (`int`, *optional*): tokens per pack in `packed`; default `default_pack_len`.
        flattened_attn (`str`): attention of the flattened modes; `"auto"` is the `flatcollate` packed backend.
        lr (`float`): AdamW learning rate.
        seed (`int`): seeds the lengths, the token ids and the initial weights.
        device (`str`): `"auto"` (CUDA when available), `"cpu"` or `"cuda"`.
        dtype (`str`): `"float32"` or `"bfloat16"`.
        threads (`int`, *optional*): CPU threads for torch (`torch.set_num_threads`); on a CPU shared with other
            work, 1 avoids threads spinning while waiting for a descheduled sibling, which distorts timings.
    """

    model: str = "llama"
    tiny: bool = True
    model_overrides: dict = field(default_factory=lambda: dict(CPU_MODEL))
    profile: str = "flan"
    batch_size: int = 8
    max_length: int = 1024
    steps: int = 8
    warmup_steps: int = 1
    repeats: int = 3
    modes: tuple[str, ...] = MODES
    pack_len: int | None = None
    flattened_attn: str = "auto"
    lr: float = 1e-4
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None


def run_throughput(config: ThroughputConfig, *, progress: bool = True) -> dict:
    """Train every mode and collect timings, memory, token counts and losses.

    Returns:
        `dict` (JSON-ready): `config`, `environment`, `pool` (the sequences trained on), `modes` (per mode:
        tokens/s median and spread, step time, peak memory, padding fraction, steps per epoch, losses),
        `ratios_vs_padded`, `loss_equivalence` and `skipped` (modes that could not run, with the reason).
    """
    unknown = sorted(set(config.modes) - set(MODES))
    if unknown:
        raise ValueError(f"Unknown mode(s) {unknown} in `modes`; choose from {MODES}.")
    device = resolve_device(config.device)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
    model = build_model(config, device=device, dtype=dtype)
    vocab = model.config.vocab_size
    profile = load_profile(config.profile)
    pool = synthetic_sequences(
        profile, config.steps * config.batch_size, max_length=config.max_length, vocab_size=vocab, seed=config.seed
    )
    warm = synthetic_sequences(
        profile, config.batch_size, max_length=config.max_length, vocab_size=vocab, seed=config.seed + 1
    )
    pack_len = config.pack_len or default_pack_len(pool, batch_size=config.batch_size, max_length=config.max_length)
    skipped = {} if has_packing() else {"packed": "flatcollate.data.packing is not available"}
    modes = [m for m in config.modes if m not in skipped]
    collator = flatcollate.DataCollatorWithFlattening()
    kwargs = {"batch_size": config.batch_size, "max_length": config.max_length, "pack_len": pack_len}
    batches, warm_batches, collate_s = {}, {}, {}
    for mode in modes:
        start = time.perf_counter()
        batches[mode] = step_batches(pool, mode, flattening_collator=collator, **kwargs)
        collate_s[mode] = time.perf_counter() - start
        warm_batches[mode] = step_batches(warm, mode, flattening_collator=collator, **kwargs)[: config.warmup_steps]
    flat_attn = resolve_flattened_attn(config.flattened_attn)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    memory = PeakMemory(device)
    runs = {mode: [] for mode in modes}
    total = config.repeats * sum(len(batches[m]) + len(warm_batches[m]) for m in modes)
    bar = tqdm(total=total, desc="training steps", unit="step", disable=not progress)
    for repeat in range(config.repeats):
        # Rotate the order each repeat so slow phases of a shared machine do not always hit the same mode.
        for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
            bar.set_postfix(repeat=repeat, mode=mode)
            model.set_attn_implementation("sdpa" if mode.startswith("padded") else flat_attn)
            run_pass(model, warm_batches[mode], initial, lr=config.lr, device=device, bar=bar)
            memory.reset()
            record = run_pass(model, batches[mode], initial, lr=config.lr, device=device, bar=bar)
            peak = memory.peak()
            record["peak_memory_bytes"] = peak
            record["added_memory_bytes"] = None if peak is None or memory.baseline is None else peak - memory.baseline
            runs[mode].append(record)
    bar.close()
    return summarize(
        config, runs, batches, collate_s, pool=pool, pack_len=pack_len, skipped=skipped, device=device, attn=flat_attn
    )


def resolve_device(name: str) -> torch.device:
    """`"auto"` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(config: ThroughputConfig, *, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """Random-weight causal LM from the config (no download), in train mode, without a KV cache."""
    if config.tiny:
        model_config = tiny_config(config.model, **config.model_overrides)
    else:
        model_config = (
            AutoConfig.from_pretrained(config.model)
            if Path(config.model).is_dir()
            else AutoConfig.for_model(config.model)
        )
        for name, value in config.model_overrides.items():
            setattr(model_config, name, value)
    model_config.use_cache = False
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa", dtype=dtype).to(device)
    prepare = getattr(flatcollate, "prepare_model_for_flattening", None)
    if prepare is not None:
        model = prepare(model) or model
    return model.train()


def resolve_flattened_attn(name: str) -> str:
    """`"auto"` -> the `flatcollate` packed attention backend when the package provides it, else `"sdpa"`."""
    if name != "auto":
        return name
    attention = getattr(flatcollate, "attention", None)
    if attention is None:
        import importlib.util

        if importlib.util.find_spec("flatcollate.attention") is None:
            return "sdpa"
        import flatcollate.attention as attention
    return attention.register_packed_attention()


def run_pass(model, batches, initial, *, lr: float, device: torch.device, bar) -> dict[str, list[float]]:
    """Reset weights and optimizer, then one optimizer step per batch.

    Returns:
        `step_s` (wall-clock seconds per step), `cpu_s` (this process's CPU seconds per step, all threads) and
        `losses`.
    """
    model.load_state_dict(initial)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    record = {"step_s": [], "cpu_s": [], "losses": []}
    for batch in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        _synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = model(**inputs, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record["losses"].append(loss.item())  # `.item()` waits for the device, so the time below covers the step
        record["step_s"].append(time.perf_counter() - start)
        record["cpu_s"].append(time.process_time() - cpu_start)
        bar.update(1)
    return record


def summarize(config, runs, batches, collate_s, *, pool, pack_len, skipped, device, attn) -> dict:
    """Turn raw per-repeat timings into medians, spreads and ratios to `padded` taken within each repeat."""
    modes = {}
    for mode, passes in runs.items():
        real = sum(real_tokens(b) for b in batches[mode])
        slots = sum(slot_tokens(b) for b in batches[mode])
        tps = np.array([real / sum(p["step_s"]) for p in passes])
        cpu_tps = np.array([real / sum(p["cpu_s"]) for p in passes])
        step_s = np.concatenate([p["step_s"] for p in passes])
        peak = [p["peak_memory_bytes"] for p in passes]
        added = [p["added_memory_bytes"] for p in passes]
        modes[mode] = {
            "tokens_per_s": _spread(tps),
            "tokens_per_cpu_s": _spread(cpu_tps) if device.type == "cpu" else None,
            "step_s": _spread(step_s),
            "peak_memory_bytes": None if None in peak else int(np.median(peak)),
            "peak_memory_over_baseline_bytes": None if None in added else int(np.median(added)),
            "real_tokens_per_epoch": real,
            "computed_tokens_per_epoch": slots,
            "padding_fraction": 1 - real / slots,
            "steps_per_epoch": len(batches[mode]),
            "collate_s": collate_s[mode],
            "losses": passes[0]["losses"],
        }
    ratios = {}
    if "padded" in runs:
        for mode, passes in runs.items():
            ratios[mode] = {"tokens_per_s": _repeat_ratios(passes, runs["padded"], "step_s")}
            if device.type == "cpu":
                ratios[mode]["tokens_per_cpu_s"] = _repeat_ratios(passes, runs["padded"], "cpu_s")
            for key in ("peak_memory_bytes", "peak_memory_over_baseline_bytes"):
                if modes[mode][key] and modes["padded"][key]:
                    ratios[mode][key.removesuffix("_bytes")] = modes[mode][key] / modes["padded"][key]
    equivalence = None
    if "padded" in runs and "flattened" in runs:
        pairs = zip(runs["padded"], runs["flattened"], strict=True)
        diff = max(float(np.abs(np.subtract(a["losses"], b["losses"])).max()) for a, b in pairs)
        equivalence = {"compared": ["padded", "flattened"], "steps": config.steps, "max_abs_loss_diff": diff}
    return {
        "config": asdict(config),
        "environment": _environment(device, attn),
        "pool": {
            "sequences": len(pool.lengths),
            "real_tokens": int(pool.lengths.sum()),
            "mean_length": float(pool.lengths.mean()),
            "max_length_seen": int(pool.lengths.max()),
            "truncated": pool.truncated,
            "pack_len": int(pack_len),
        },
        "modes": modes,
        "ratios_vs_padded": ratios,
        "loss_equivalence": equivalence,
        "skipped": skipped,
    }


def _repeat_ratios(passes: list[dict], baseline: list[dict], key: str) -> dict:
    """Throughput ratio to the baseline within each repeat: every mode trains the same tokens per pass, so it is the
    baseline's pass time over this mode's pass time."""
    base = np.array([sum(p[key]) for p in baseline])
    return _spread(base / np.array([sum(p[key]) for p in passes]))


def _spread(values) -> dict:
    values = np.asarray(values, dtype=np.float64)
    median, low, high = float(np.median(values)), float(values.min()), float(values.max())
    return {"median": median, "min": low, "max": high, "n": int(values.size)}


def _environment(device: torch.device, attn: str) -> dict:
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "device_type": device.type,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "flattened_attn": attn,
        "padded_attn": "sdpa",
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
