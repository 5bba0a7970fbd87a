"""KTO (`flatcollate bench --task kto`): `trl.KTOTrainer` on padded batches against `FlatKTOTrainer` on flattened
rows, on the pairs of the pair profile taken apart: each pair is a desirable example (its prompt and chosen reply) and
an undesirable one (its prompt and rejected reply), `2 * batch_size` examples per step.

`KTOTrainer` appends the eos to each completion and, for the KL term of its default loss, pairs every prompt of a
batch with the completion of the example before it (rotated by one within the batch: the first takes the last). It
pads the completions and the KL completions into two batches; `FlatKTOTrainer` puts each in one row::

    examples (p, c)    (2, 2)  (1, 3)            c counts the eos
    padded (2, 4)      [p p c e]  [p c c e]      KL (2, 5)  [p p c c e]  [p c e . .]     18 slots, 16 real
    flattened (1, 8)   [p p c e | p c c e]       KL (1, 8)  [p p c c e | p c e]
"""

import numpy as np
import torch

from ...profiles.load import padded_batches
from ...synthetic.pairs import EOS_PER_REPLY, PairDraw, pair_texts
from ..config import PairBenchConfig
from ..pairs import draw_pairs, interleave, pair_task
from ..trainers import policy_and_reference, train_pairs


def unpaired_lengths(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(prompt, completion, KL completion)` token counts of each example of `draw` taken apart, as `KTOTrainer`
    tokenizes them: the chosen example of a pair, then its rejected one; a completion holds its eos; the KL completion
    of an example is the completion of the one before it in its batch of `2 * batch_size` examples, the first taking
    the last.

    >>> draw = PairDraw(np.array([2, 1]), np.array([1, 0]), np.array([0, 1]), max_length=64)
    >>> [a.tolist() for a in unpaired_lengths(draw, batch_size=1)]
    [[2, 2, 1, 1], [2, 1, 1, 2], [1, 2, 2, 1]]
    """
    prompt = np.repeat(draw.prompt, 2)
    completion = interleave(draw.chosen, draw.rejected) + EOS_PER_REPLY
    batches = np.split(completion, np.arange(2 * batch_size, completion.size, 2 * batch_size))
    return prompt, completion, np.concatenate([np.roll(batch, 1) for batch in batches])


def unpaired_sequences(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of each example's sequence (prompt + completion) and of its KL sequence (prompt + KL completion), before
    the cut to `max_length` (`unpaired_lengths`)."""
    prompt, completion, kl = unpaired_lengths(draw, batch_size=batch_size)
    return prompt + completion, prompt + kl


def kto_sequences(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`unpaired_sequences` cut to `max_length`, as `KTOTrainer`'s collator cuts them."""
    return tuple(np.minimum(lengths, draw.max_length) for lengths in unpaired_sequences(draw, batch_size=batch_size))


def timed_kto_sequences(config: PairBenchConfig, draw: PairDraw) -> np.ndarray:
    """Uncut lengths of the sequences of the timed steps (`unpaired_sequences`): the examples', then their KL
    sequences."""
    timed = slice(2 * config.warmup_steps * config.batch_size, None)
    return np.concatenate([lengths[timed] for lengths in unpaired_sequences(draw, batch_size=config.batch_size)])


def padded_kto_tokens(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and padded token counts of each of `KTOTrainer`'s steps on `draw`: the `(2N, longest)` batch of the
    examples' sequences (prompt + completion, cut to `max_length`) and the `(2N, longest)` batch of their KL
    sequences, together (`kto_sequences`).

    >>> draw = PairDraw(np.array([2, 1]), np.array([0, 1]), np.array([1, 0]), max_length=64)  # sequences 3 4 3 2
    >>> padded_kto_tokens(draw, batch_size=2)  # KL sequences 3 3 3 3: 4 x 4 + 4 x 3 slots
    (array([24]), array([28]))
    """
    sequences, kl_sequences = kto_sequences(draw, batch_size=batch_size)
    real, padded = padded_batches(sequences, batch_size=2 * batch_size)
    kl_real, kl_padded = padded_batches(kl_sequences, batch_size=2 * batch_size)
    return real + kl_real, padded + kl_padded


def measure(config: PairBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: train `KTOTrainer` (`padded`) or `FlatKTOTrainer` (`flattened`, which prepares its own copy of the
    model), `2 * batch_size` examples per step."""
    models = policy_and_reference(config, device)
    draw = draw_pairs(config)
    rows = [
        {"prompt": row["prompt"], "completion": row[reply], "label": reply == "chosen"}
        for row in pair_texts(draw, vocab_size=models["model"].config.vocab_size, seed=config.seed)
        for reply in ("chosen", "rejected")
    ]
    timed = slice(2 * config.warmup_steps * config.batch_size, None)
    sequences, kl_sequences = (lengths[timed] for lengths in kto_sequences(draw, batch_size=config.batch_size))
    return train_pairs(
        config,
        mode,
        device,
        trainers=("KTOTrainer", "FlatKTOTrainer", "KTOConfig"),
        trained=sequences,
        scored=np.concatenate([kl_sequences, sequences, kl_sequences]),  # the policy's KL pass, the reference's two
        options={"per_device_train_batch_size": 2 * config.batch_size},
        rows=rows,
        keys=("prompt_ids", "completion_ids", "KL_completion_ids"),
        expected=np.stack(unpaired_lengths(draw, batch_size=config.batch_size), axis=1),
        **models,
    )


TASK = pair_task(
    "kto",
    padded="KTOTrainer",
    flattened="FlatKTOTrainer",
    measure=measure,
    whole=False,
    step="collation, the policy's and the reference's forwards on the completions and on the KL completions, "
    "backward, optimizer; a pair is a desirable and an undesirable example; the policy starts as its reference copy",
    layout=padded_kto_tokens,
    sequences=timed_kto_sequences,
    pair="a desirable and an undesirable example, each a sequence and a KL sequence (its prompt + the completion of "
    "the example before it)",
    padding="the 2N completions and the 2N KL completions, each batch padded to its longest",
    rows="the 2N completions in one flattened row, their KL completions in another",
)
