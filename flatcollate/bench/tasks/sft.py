"""Text SFT (`flatcollate bench`): padded, padded to max_length, transformers' own padding-free path, flattened and
packed batches of the same synthetic sequences, drawn from a length profile (`flatcollate.bench.batches`).

Every mode trains the same model from the same initial weights on the same sequences, so the loss curves of `padded`
and `flattened` must coincide. The parent collates every mode's batches once to count their tokens; each worker
collates its own mode's again, from the same seed.
"""

from collections.abc import Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from ...profiles.load import load_profile, padded_fill
from ...synthetic.sequences import SyntheticSequences, synthetic_sequences
from ...testing.tiny_text import sdpa_or_eager
from ..batches import Plan, default_pack_len, plan_modes, real_tokens, step_batches
from ..build import build_on_device, model_config, model_summary
from ..config import BATCHED_MODE, PEER_MODE, SFTBenchConfig
from ..flops import step_flops
from ..harness import PROFILE_DRAWS, Task, Workload, sequence_data
from ..timing import TrainingSteps, timed_pass


def plan_batches(config: SFTBenchConfig, *, vocab_size: int, modes: Sequence[str]) -> Plan:
    """Draw the sequences (the same in every process) and collate each of `modes`' batches (`batches.plan_modes`)."""
    from ... import DataCollatorWithFlattening

    profile = load_profile(config.profile)
    draw = {"max_length": config.max_length, "vocab_size": vocab_size}
    pool = synthetic_sequences(profile, config.steps * config.batch_size, seed=config.seed, **draw)
    warm = synthetic_sequences(profile, config.batch_size, seed=config.seed + 1, **draw)
    options = {"batch_size": config.batch_size, "max_length": config.max_length, "pack_len": pack_len(config, pool)}
    options["flattening_collator"] = DataCollatorWithFlattening()

    def collate(mode: str, seqs: SyntheticSequences) -> list[dict]:
        return step_batches(seqs, mode, **options)

    return plan_modes(modes, collate, pool, warm, max_length=config.max_length, warmup_steps=config.warmup_steps)


def pack_len(config: SFTBenchConfig, pool: SyntheticSequences) -> int:
    """Tokens per pack of the `packed` mode: `config.pack_len`, by default `default_pack_len` of the drawn pool."""
    return config.pack_len or default_pack_len(pool, batch_size=config.batch_size, max_length=config.max_length)


def profile_padding(config: SFTBenchConfig) -> tuple[float, float]:
    """The padding fraction of padded batches of this size over `PROFILE_DRAWS` sequences of the profile, cut to
    `max_length` and not."""
    prompt, completion = load_profile(config.profile).sample(PROFILE_DRAWS, seed=config.seed)
    full = prompt + completion
    cut, whole = (padded_fill(n, batch_size=config.batch_size) for n in (np.minimum(full, config.max_length), full))
    return 1 - cut, 1 - whole


def workload(config: SFTBenchConfig) -> Workload:
    """Every mode's batches, collated here to count their tokens and steps and time their collation."""
    plan = plan_batches(config, vocab_size=model_config(config).vocab_size, modes=config.modes)
    pool = plan.pool
    padding, untruncated = profile_padding(config)
    sample = f"{PROFILE_DRAWS:,} sequences"
    data = sequence_data(pool.lengths, truncated=pool.truncated, profile_padding=padding, profile_sample=sample)
    data |= {"profile_padding_untruncated": untruncated, "pack_len": int(pack_len(config, pool))}
    assert sum(real_tokens(b) for b in plan.batches[config.modes[0]]) == int(pool.lengths.sum())
    return Workload.from_batches(plan.batches, data, plan.collate_s)


def measure(config: SFTBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: build the model (prepared by flatcollate unless the mode is transformers' own path), collate the mode's
    batches, warm up and time one pass (`flatcollate.bench.timing.timed_pass`)."""
    from ...attention.dispatch import register_packed_attention
    from ...modeling.prepare import prepare_model_for_flattening
    from ...modeling.stateful_layers import segment_mixers

    model = build_on_device(
        AutoModelForCausalLM, model_config(config), device=device, dtype=config.dtype, seed=config.seed
    )
    if mode == BATCHED_MODE:  # each state-carrying layer called once, on the sequences as a padded batch
        segment_mixers(model, mode="batched")
    if mode != PEER_MODE:  # transformers' own padding-free path runs on a model flatcollate has not prepared
        model = prepare_model_for_flattening(model)
        flat = register_packed_attention() if config.attn == "auto" else config.attn
        model.set_attn_implementation(sdpa_or_eager(type(model)) if mode.startswith("padded") else flat)
    plan = plan_batches(config, vocab_size=model.config.vocab_size, modes=[mode])
    figures = timed_pass(TrainingSteps(model, lr=config.lr), plan.batches[mode], plan.warm_batches[mode], device=device)
    return {
        **figures,
        "attn": model.config._attn_implementation,
        "pass_flops": step_flops(model, trained=plan.pool.lengths),
        "model": model_summary(model),
        "environment": {},
    }


def data_lines(result: dict) -> list[str]:
    """The padding of the profile's padded batches without the cut to `max_length`."""
    padding = result["data"]["profile_padding_untruncated"]
    return [f"padding of the profile's padded batches without the cut to max_length: {padding:.1%}"]


def validate(config: SFTBenchConfig) -> None:
    """The profile, the attention backend, the pack length and the memory it needs."""
    from ..options import check_attn, check_memory, check_pack_len, check_profile
    from ..timing import resolve_device

    check_profile(config.profile)
    device = resolve_device(config.device).type
    check_attn(config.attn, device)
    check_pack_len(config.pack_len, config.max_length)
    check_memory(config, device)


TASK = Task(
    name="sft",
    flag="--task sft",
    config=SFTBenchConfig,
    files="throughput",
    modes={
        "padded": "padded to the longest in the batch, attention_mask, sdpa",
        "padded_max": "padded to max_length, attention_mask, sdpa",
        PEER_MODE: "transformers' DataCollatorWithFlattening + the model's own sdpa (padding-free without flatcollate)",
        BATCHED_MODE: "flatcollate, state-carrying layers called once per layer on the sequences as a padded batch",
        "flattened": "flatcollate: DataCollatorWithFlattening + prepare_model_for_flattening",
        "packed": "flatcollate: best-fit-decreasing packs, flattened",
    },
    subject="flatcollate (flattened)",
    baseline="padded batches",
    scope="the text SFT benchmark trains a causal LM on token ids; add --vision for image-text",
    workload=workload,
    measure=measure,
    data_lines=data_lines,
    validate=validate,
)
