"""Per-run figures of the DPO benchmark's workers into medians, spreads, the ratio of the trainers and the loss
agreement (`flatcollate.bench.dpo.run_dpo_bench`'s result).

Both trainers train the same real tokens per run (the pairs are drawn once from the seed), so real tokens per second
is those tokens over the summed step times of a run. The headline follows the rule of every benchmark
(`summary.headline`: the median of the ratios taken within each repeat, on CPU seconds on a CPU); `ratio` keeps the
ratio of the medians with the min-max of the within-repeat ratios (`repeats.ratio_spread`) for the JSON.
"""

from dataclasses import asdict

import numpy as np
import torch

from .config import DPO_MODES, TASKS, DPOBenchConfig
from .dpo_data import draw_pairs, padded_pair_tokens, profile_padding
from .repeats import Repeats, ratio_spread, spread
from .summary import cpu_name, headline


def summarize_dpo(config: DPOBenchConfig, run: Repeats, *, device: torch.device, task: str = "dpo") -> dict:
    """The result of `run_dpo_bench` from the figures of every run (`dpo.measure_dpo_mode`), see its docstring;
    `task="reward"` for `reward.run_reward_bench` (pairs drawn whole, as `RewardTrainer` drops longer ones)."""
    whole = task == "reward"
    draw = draw_pairs(config, whole=whole)
    real, slots = padded_pair_tokens(*draw.sequence_lengths(), batch_size=config.batch_size)
    real, slots = int(real[config.warmup_steps :].sum()), int(slots[config.warmup_steps :].sum())
    computed = {"padded": slots, "flattened": real}
    modes, tokens_per_s, tokens_per_cpu_s = {}, {}, {}
    for mode in DPO_MODES:
        tokens_per_s[mode] = [real / sum(seconds) for seconds in run.values(mode, "step_s")]
        tokens_per_cpu_s[mode] = [real / sum(seconds) for seconds in run.values(mode, "cpu_s")]
        peak, added = run.values(mode, "peak_memory_bytes"), run.values(mode, "added_memory_bytes")
        modes[mode] = {
            "tokens_per_s": spread(tokens_per_s[mode]),
            "tokens_per_cpu_s": spread(tokens_per_cpu_s[mode]),
            "seconds_per_step": spread(np.concatenate(run.values(mode, "step_s"))),
            "peak_memory_bytes": None if None in peak else int(np.median(peak)),
            "peak_memory_over_baseline_bytes": None if None in added else int(np.median(added)),
            "real_tokens": real,
            "computed_tokens": computed[mode],
            "padding_fraction": 1 - real / computed[mode],
            "optimizer_steps": sorted(set(run.values(mode, "optimizer_steps"))),
            "losses": run.first(mode, "losses"),
        }
    pairs = zip(run.values("padded", "losses"), run.values("flattened", "losses"), strict=True)
    gap = max(float(np.abs(np.subtract(a, b)).max()) for a, b in pairs)
    chosen, rejected = draw.sequence_lengths()
    return {
        "task": task,
        "config": asdict(config),
        "environment": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "device_type": device.type,
            "torch_threads": run.first("padded", "torch_threads"),
            "torch": torch.__version__,
            "gradient_checkpointing": run.first("padded", "gradient_checkpointing"),
            "process_per_run": True,
        },
        "model": run.first("padded", "model"),
        "pairs": {
            "pairs": int(draw.prompt.size),
            "timed_pairs": config.steps * config.batch_size,
            "mean_sequence_length": float(np.concatenate([chosen, rejected]).mean()),
            "longest_sequence": int(max(chosen.max(), rejected.max())),
            "truncated_sequences": draw.truncated,
            "profile_padding_fraction": profile_padding(config, whole=whole),
        },
        "modes": modes,
        "ratio": {
            "tokens_per_s": ratio_spread(tokens_per_s["flattened"], tokens_per_s["padded"]),
            "tokens_per_cpu_s": ratio_spread(tokens_per_cpu_s["flattened"], tokens_per_cpu_s["padded"]),
        },
        "headline": headline(
            run.figures, device, subject=TASKS[task]["flattened"], baseline=TASKS[task]["padded"]
        ),
        "loss_equivalence": {
            "compared": list(DPO_MODES),
            "steps": len(run.first("padded", "losses")),
            "max_abs_loss_diff": gap,
        },
    }
