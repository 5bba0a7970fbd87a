"""What the preference tasks (`dpo`, `kto`, `reward`, `grpo`) train on: the synthetic pairs of
`flatcollate.synthetic.pairs` drawn from a benchmark config, the padding TRL's batches of them carry, and the `Task`
they share (`pair_task`).

TRL tokenizes the prompt and each reply and appends the eos to each reply, so a pair of lengths `(p, c, r)` trains two
sequences of `p + c + 1` and `p + r + 1` tokens, each cut to `max_length`. A batch of `N` pairs is `2N` sequences,
chosen first; `DPOTrainer` pads them all to the longest, `FlatDPOTrainer` puts them in one row::

    pairs (p, c, r)   (3, 1, 2)  (1, 1, 1)
    padded (4, 6)     [p p p c e .]  [p c e . . .]  [p p p r r e]  [p r e . . .]     24 slots, 17 real
    flattened (1, 17) [p p p c e | p c e | p p p r r e | p r e]
"""

import numpy as np

from ..profiles.load import padded_batches
from ..profiles.pair_profile import load_pair_profile
from ..synthetic.pairs import EOS_PER_REPLY, PairDraw, sample_pairs
from .config import PairBenchConfig
from .harness import PROFILE_DRAWS, Task, Workload, sequence_data


def draw_pairs(
    config: PairBenchConfig, n: int | None = None, *, seed: int | None = None, whole: bool = False
) -> PairDraw:
    """`sample_pairs` of the config: `n` pairs (default: `(warmup_steps + steps) * batch_size`, the whole run) of its
    profile and `max_length`, seeded by its seed unless `seed` is given; `whole` as there."""
    n = (config.warmup_steps + config.steps) * config.batch_size if n is None else n
    seed = config.seed if seed is None else seed
    return sample_pairs(config.profile, n, max_length=config.max_length, seed=seed, whole=whole)


def padded_pair_tokens(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and padded token counts of each of `DPOTrainer`'s and `RewardTrainer`'s batches of `draw`: consecutive
    pairs, `batch_size` at a time (the last batch may hold fewer), the `2N` sequences (prompt + reply + eos, cut to
    `max_length`: `PairDraw.sequence_lengths`) padded to the longest of them.

    Returns:
        `(real, slots)`, each `np.ndarray` of shape `(B,)`, int64: tokens of the sequences and of the padded
        `(2N, L)` batch.

    >>> draw = PairDraw(np.array([3, 1]), np.array([1, 1]), np.array([2, 1]), max_length=64)  # sequences 5 3 | 6 3
    >>> padded_pair_tokens(draw, batch_size=2)
    (array([17]), array([24]))
    """
    return padded_batches(interleave(*draw.sequence_lengths()), batch_size=2 * batch_size)


def interleave(chosen: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    """`(2N,)`: each pair's chosen, then its rejected, so that `2 * batch_size` consecutive rows are a batch's pairs
    (the order within a batch changes neither its real tokens nor its longest row)."""
    return np.stack([chosen, rejected], axis=1).reshape(-1)


def profile_padding(config: PairBenchConfig, *, whole: bool = False, layout=padded_pair_tokens) -> float:
    """Padding fraction of the padded trainer's batches over `PROFILE_DRAWS` pairs of the profile, not only the
    pairs one run draws; `whole` as in `draw_pairs`, `layout(draw, batch_size=...)` counts a batch's tokens."""
    real, slots = layout(draw_pairs(config, PROFILE_DRAWS, whole=whole), batch_size=config.batch_size)
    return float(1 - real.sum() / slots.sum())


def pair_workload(
    config: PairBenchConfig,
    *,
    whole: bool,
    modes: tuple[str, ...],
    layout=padded_pair_tokens,
    sequences=None,
) -> Workload:
    """What both trainers train on in their timed steps (after `warmup_steps`): the sequences of the drawn pairs,
    padded (`padded`, as `layout(draw, batch_size=...)` counts) or not (`flattened`); `whole` as in `draw_pairs`;
    `sequences(config, draw)` gives the uncut lengths of the timed steps' sequences (default `timed_sequences`)."""
    draw = draw_pairs(config, whole=whole)
    real, slots = layout(draw, batch_size=config.batch_size)
    real, slots = int(real[config.warmup_steps :].sum()), int(slots[config.warmup_steps :].sum())
    uncut = (sequences or timed_sequences)(config, draw)
    lengths = np.minimum(uncut, config.max_length)
    assert int(lengths.sum()) == real, "the sequences and the layout count other tokens"
    data = sequence_data(
        lengths,
        truncated=int((uncut > config.max_length).sum()),
        profile_padding=profile_padding(config, whole=whole, layout=layout),
        profile_sample=f"{PROFILE_DRAWS:,} pairs",
    )
    steps = {mode: config.steps for mode in modes}
    return Workload(modes, real, {"padded": slots, "flattened": real}, steps, data)


def timed_sequences(config: PairBenchConfig, draw: PairDraw) -> np.ndarray:
    """`(2 * steps * batch_size,)` int64 uncut lengths (prompt + reply + eos) of the sequences of the timed steps of
    `draw`, the pairs after the config's warm-up steps, the chosen ones first."""
    first = config.warmup_steps * config.batch_size
    return np.concatenate([lengths[first:] for lengths in draw.uncut_lengths()])


def timed_lengths(config: PairBenchConfig, draw: PairDraw) -> np.ndarray:
    """`timed_sequences` cut to `max_length`: the tokens each trains on (for their model FLOPs)."""
    return np.minimum(timed_sequences(config, draw), config.max_length)


def pair_lines(result: dict, *, pair: str) -> list[str]:
    """The report's line about the pairs of a step; `pair` says what sequences a pair is."""
    return [f"{result['config']['batch_size']} pairs per step, each {pair}"]


def validate_pairs(config: PairBenchConfig, *, trainer: str, whole: bool) -> None:
    """Raise `UsageError` for what would fail later: trl missing or not importable, an unknown pair profile, a
    `max_length` no pair's prompt (with `whole`: no whole pair) fits in. `trainer` names TRL's trainer in the
    messages."""
    from ..cli import UsageError

    try:
        import trl  # noqa: F401  (what the workers import: found on the path is not enough)
    except ImportError as error:
        raise UsageError(
            f"this benchmark trains with trl.{trainer}, and trl does not import ({error}): pip install trl."
        ) from None
    try:
        profile = load_pair_profile(config.profile)
    except ValueError as error:
        raise UsageError(f"--profile {config.profile}: {str(error).splitlines()[0]}") from None
    shortest = int(profile.prompt.min())
    if shortest >= config.max_length:
        raise UsageError(
            f"--max-length {config.max_length}: every prompt of the pair profile {config.profile} is at least "
            f"{shortest} tokens, and TRL drops pairs whose prompt fills max_length; raise --max-length."
        )
    pair = int((profile.prompt + np.maximum(profile.chosen, profile.rejected)).min()) + EOS_PER_REPLY
    if whole and pair > config.max_length:
        raise UsageError(
            f"--max-length {config.max_length}: no pair of the pair profile {config.profile} fits (the shortest, "
            f"prompt + longer reply + eos, is {pair} tokens), and {trainer} drops longer pairs; raise --max-length."
        )


def pair_task(
    name: str,
    *,
    padded: str,
    flattened: str,
    measure,
    whole: bool,
    step: str,
    layout=padded_pair_tokens,
    sequences=None,
    pair: str = "two sequences (prompt + reply + eos)",
    padding: str = "each batch's 2N sequences padded to the longest",
    rows: str = "the 2N sequences in one flattened row",
    verb: str = "trains",
) -> Task:
    """The `Task` of a preference benchmark: TRL's trainer `padded` on padded batches against flatcollate's
    `flattened` on flattened rows, on pairs drawn from the pair profile (`whole`: only pairs that fit, as
    `draw_pairs`); `step` says what one step does, `pair` what sequences a pair is, `padding` how `padded` pads and
    `rows` what `flattened` flattens (for the report), `layout` counts its batches' tokens and `sequences` gives its
    sequences (`pair_workload`), `verb` is the headline's (`Task.verb`)."""
    return Task(
        name=name,
        flag=f"--task {name}",
        config=PairBenchConfig,
        files=name,
        modes={
            "padded": f"trl.{padded}: {padding}, attention_mask, sdpa",
            "flattened": f"flatcollate {flattened}: {rows}, the flatcollate backend",
        },
        subject=flattened,
        baseline=padded,
        scope=f"it compares trl.{padded} on padded batches with {flattened} on flattened rows",
        workload=lambda config: pair_workload(
            config, whole=whole, modes=("padded", "flattened"), layout=layout, sequences=sequences
        ),
        measure=measure,
        data_lines=lambda result: pair_lines(result, pair=pair),
        validate=lambda config: validate_pairs(config, trainer=padded, whole=whole),
        legend=(f"- a step runs from the end of the step before to its own end: {step}",),
        verb=verb,
    )
