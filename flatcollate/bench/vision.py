"""Vision profile of the throughput benchmark: padded vs flattened training of a small Qwen2.5-VL-shaped model on
image-text examples whose text lengths come from a length profile and whose image sizes follow Qwen2-VL's dynamic
resolution.

Examples and the image-size assumption: `flatcollate.bench.vision_inputs`; the config and the model:
`flatcollate.bench.vision_config`.

`padded`: the processor-style batch, right padded, `attention_mask`, `mm_token_type_ids`, and no `position_ids`, so
the unprepared model computes every example's 3-D positions itself (`get_rope_index` with the mask), on SDPA.
`flattened`: `VisionDataCollatorWithFlattening` on the model prepared by `prepare_model_for_flattening`. Vision fields
(`pixel_values`, `image_grid_thw`) are the same tensors in both modes, so the vision tower does the same work.

Every (mode, repeat) is a fresh process (`python -m flatcollate.bench.vision --worker <payload>`,
`flatcollate.bench.repeats`) that builds the model from the seed, draws the same examples, settles, then runs one
untimed and one timed pass; the modes take turns, the order rotating, and ratios to `padded` are taken within each
repeat, as in the text profile.
"""

import functools
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..modeling.prepare import prepare_model_for_flattening
from ..profiles.load import load_profile, padded_fill
from ..vision import VisionDataCollatorWithFlattening
from .batches import check_labelled
from .memory import PeakMemory
from .plan import PROFILE_FILL_SAMPLE
from .repeats import Runner, run_repeats, serve_worker
from .summary import summarize
from .throughput import SETTLE_STEPS, bench_threads, resolve_device, settle, timed_pass
from .vision_config import (
    VISION_MODES,
    VisionBenchConfig,
    build_vision_model,
    check_vision_config,
    vision_config_from_json,
)
from .vision_inputs import (
    VisionPool,
    block_lengths,
    draw_lengths,
    draw_vision_pool,
    padded_vision_batch,
    vision_examples,
)

WORKER = ("-m", "flatcollate.bench.vision")
"""How the parent starts a worker: `python -m flatcollate.bench.vision --worker <payload>`."""


@dataclass(frozen=True)
class VisionPlan:
    """What every mode trains on, drawn from the config's seed: the examples, each mode's timed and warm-up batches,
    the time each mode's collation took."""

    pool: VisionPool
    batches: dict[str, list[dict]]
    warm_batches: dict[str, list[dict]]
    collate_s: dict[str, float]


def plan_vision_batches(config: VisionBenchConfig, model, modes=VISION_MODES) -> VisionPlan:
    """Draw the examples (the same in every process) and collate each of `modes`' batches. `model` is the unprepared
    model; it is prepared in place before the flattened batches are collated (their collator reads its forward)."""
    profile = load_profile(config.profile)
    draw = {"max_length": config.max_length, "images": config.images}
    pool = draw_vision_pool(profile, config.steps * config.batch_size, seed=config.seed, **draw)
    warm = draw_vision_pool(profile, config.batch_size, seed=config.seed + 10, **draw)
    examples = vision_examples(model, pool, np.arange(len(pool.lengths)), seed=config.seed)
    warm_examples = vision_examples(model, warm, np.arange(len(warm.lengths)), seed=config.seed + 1)
    batches, warm_batches, collate_s = {}, {}, {}
    for mode in modes:
        if mode == "padded":
            collate = functools.partial(padded_vision_batch, pad_token_id=model.config.text_config.pad_token_id or 0)
        else:
            collate = VisionDataCollatorWithFlattening.from_model(prepare_model_for_flattening(model))
        start = time.perf_counter()
        size = config.batch_size
        batches[mode] = [collate(examples[i : i + size]) for i in range(0, len(examples), size)]
        collate_s[mode] = time.perf_counter() - start
        check_labelled(batches[mode], mode, max_length=config.max_length)
        warm_batches[mode] = [collate(warm_examples)][: config.warmup_steps]
    return VisionPlan(pool, batches, warm_batches, collate_s)


def measure_vision_mode(config: VisionBenchConfig, mode: str) -> dict:
    """Worker: train `mode` alone in this process: settle, one untimed pass, one timed pass.

    Returns:
        `dict` (JSON-ready): the timed pass's `step_s`, `cpu_s`, `losses`, `peak_memory_bytes`, `added_memory_bytes`
        (`flatcollate.bench.throughput.timed_pass`), `settle_passes` and `attn` (the language model's backend).
    """
    check_vision_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        model = build_vision_model(config, device=device)
        initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        plan = plan_vision_batches(config, model, modes=[mode])
        bar = _NoBar()
        settled = settle(model, plan.batches[mode][:SETTLE_STEPS], initial, lr=config.lr, device=device, bar=bar)
        record = timed_pass(model, plan, mode, initial, lr=config.lr, memory=PeakMemory(device), bar=bar)
    return {**record, **settled, "attn": model.config.text_config._attn_implementation}


class _NoBar:
    """What `run_pass` and `settle` advance in a worker (its progress is its parent's bar over the runs)."""

    def update(self, steps: int = 1) -> None:
        pass


def run_vision_bench(config: VisionBenchConfig, *, progress: bool = True, runner: Runner | None = None) -> dict:
    """Train `padded` and `flattened` `config.repeats` times each, every run a fresh process, the modes taking turns;
    collect timings, memory, token counts and losses.

    Args:
        config (`VisionBenchConfig`): what to measure.
        progress (`bool`): a progress bar over the runs on stderr.
        runner (`Runner`, *optional*): carries out one run (default: a worker process).

    Returns:
        `dict` (JSON-ready) shaped as `run_throughput`'s (`config`, `environment`, `headline`, `modes`,
        `ratios_vs_padded`, `loss_equivalence`, `model`), with `pool` counting image tokens and `images` describing
        the drawn images.
    """
    check_vision_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        model = build_vision_model(config, device=torch.device("cpu"), dtype="float32")
        summary = vision_model_summary(model)  # before preparing: the flattened collator prepares it in place
        plan = plan_vision_batches(config, model)
        (run,) = run_repeats(
            [sys.executable, *WORKER],
            [{"config": asdict(config)}],
            VISION_MODES,
            repeats=config.repeats,
            label=lambda case: f"vision {case['config']['profile']}",
            progress=progress,
            runner=runner,
        )
        # Padding efficiency of the whole distribution (lengths only), not only of the few examples trained on.
        draw = {"max_length": config.max_length, "images": config.images}
        many = draw_lengths(load_profile(config.profile), PROFILE_FILL_SAMPLE, seed=config.seed, **draw)
        fill = {"profile": padded_fill(many, batch_size=config.batch_size)}
        result = summarize(
            config,
            run.figures,
            plan.batches,
            plan.collate_s,
            pool=plan.pool.text,
            pack_len=0,
            skipped={},
            device=device,
            attn=run.first("flattened", "attn"),
            profile_fill=fill,
            settle_passes={mode: run.values(mode, "settle_passes") for mode in VISION_MODES},
        )
    result["environment"]["process_per_pass"] = True
    result["pool"] = pool_summary(plan.pool, result, fill["profile"])
    result["images"] = image_summary(config, plan.pool)
    result["model"] = summary
    return result


def vision_model_summary(model) -> dict:
    """Model type, parameter counts and the sizes the report prints."""
    text, vision = model.config.text_config, model.config.vision_config
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return {
        "model_type": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vision_parameters": sum(p.numel() for p in model.model.visual.parameters()),
        **{name: getattr(text, name) for name in sizes},
        "vision_hidden_size": vision.hidden_size,
        "vision_layers": vision.depth,
    }


def pool_summary(pool: VisionPool, result: dict, profile_fill: float) -> dict:
    """Token counts of the trained examples and the padding efficiency of padded batches."""
    padded = result["modes"]["padded"]
    return {
        "sequences": len(pool.lengths),
        "real_tokens": int(pool.lengths.sum()),
        "text_tokens": int(pool.text.lengths.sum()),
        "image_tokens": int(pool.lengths.sum() - pool.text.lengths.sum()),
        "mean_length": float(pool.lengths.mean()),
        "max_length_seen": int(pool.lengths.max()),
        "text_truncated": pool.text.truncated,
        "padding_efficiency": padded["real_tokens_per_epoch"] / padded["computed_tokens_per_epoch"],
        "profile_padding_efficiency": profile_fill,
    }


def image_summary(config: VisionBenchConfig, pool: VisionPool) -> dict:
    """How the images were drawn (a stated assumption) and what was drawn."""
    tokens = block_lengths(pool.grids) - 2
    return {
        "distribution": config.images.describe(),
        "min_pixels": config.min_pixels,
        "max_pixels": config.max_pixels,
        "max_images": config.max_images,
        "images": int(pool.images.sum()),
        "image_tokens_per_image": {
            "mean": float(tokens.mean()) if tokens.size else 0.0,
            "min": int(tokens.min()) if tokens.size else 0,
            "max": int(tokens.max()) if tokens.size else 0,
        },
    }


if __name__ == "__main__":
    serve_worker(sys.argv[1:], lambda case, mode: measure_vision_mode(vision_config_from_json(case["config"]), mode))
