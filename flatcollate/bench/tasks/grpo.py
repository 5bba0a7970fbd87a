"""GRPO log-prob passes (`flatcollate bench --task grpo`): `trl.GRPOTrainer`'s per-token log-probabilities of the
completions on its padded batches against `FlatGRPOTrainer`'s on one flattened row: the pass GRPO runs without
gradients for its reference model and old policy (`flatcollate.integrations.trl.grpo`).

Each prompt of the pair profile is completed twice, by its chosen and by its rejected reply, each with an eos (two
generations per prompt, `batch_size` prompts per step). `GRPOTrainer` left-pads the prompts to the longest prompt
and right-pads the completions to the longest completion of the batch::

    prompt; completions   (3; 1, 2)            (1; 1, 1)
    padded (4, 6)         [p p p c e .]  [p p p r r e]  [. . p c e .]  [. . p r e .]     24 slots, 17 real
    flattened (1, 17)     [p p p c e | p p p r r e | p c e | p r e]

A step is one pass over a batch, timed after the warm-up of `flatcollate.bench.timing.timed_pass`; its loss is the
mean negative log-probability of the batch's completion tokens, which both passes must agree on.
"""

import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from ...profiles.load import padded_batches
from ...synthetic.pairs import EOS_PER_REPLY, PairDraw
from ..build import build_on_device, model_config, model_summary
from ..config import PairBenchConfig
from ..flops import step_flops
from ..pairs import draw_pairs, interleave, pair_task, timed_lengths
from ..timing import timed_pass

GENERATIONS = 2
"""Completions per prompt: its chosen and its rejected reply."""


def padded_grpo_tokens(draw: PairDraw, *, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and padded token counts of each of `GRPOTrainer`'s batches of `draw` (`grpo_batches`): `batch_size`
    prompts at a time (the last batch may hold fewer), each with its two completions, `(2N, longest prompt + longest
    completion)`.

    >>> draw = PairDraw(np.array([3, 1]), np.array([1, 1]), np.array([2, 1]), max_length=64)
    >>> padded_grpo_tokens(draw, batch_size=2)
    (array([17]), array([24]))
    """
    rows = GENERATIONS * batch_size
    prompt_real, prompt_padded = padded_batches(np.repeat(draw.prompt, GENERATIONS), batch_size=rows)
    replies = interleave(draw.chosen, draw.rejected) + EOS_PER_REPLY
    reply_real, reply_padded = padded_batches(replies, batch_size=rows)
    return prompt_real + reply_real, prompt_padded + reply_padded


def grpo_batches(draw: PairDraw, *, batch_size: int, vocab_size: int, seed: int) -> list[dict]:
    """`GRPOTrainer`'s batches of `draw`, padded as it pads them (`trl.trainer.utils.pad`: prompts on the left,
    completions on the right): `input_ids` and `attention_mask` `(2N, W)` int64 and `logits_to_keep` (the completion
    width) per step, a prompt's two completions in adjacent rows after the same prompt ids, random ids, 0 on
    padding."""
    from trl.trainer.utils import pad

    generator, batches = torch.Generator().manual_seed(seed), []
    for start in range(0, draw.prompt.size, batch_size):
        part = slice(start, start + batch_size)
        prompts = [torch.randint(1, vocab_size, (int(n),), generator=generator) for n in draw.prompt[part]]
        prompts = [ids for ids in prompts for _ in range(GENERATIONS)]
        replies = interleave(draw.chosen[part], draw.rejected[part]) + EOS_PER_REPLY
        completions = [torch.randint(1, vocab_size, (int(n),), generator=generator) for n in replies]
        sides = ((prompts, "left"), (completions, "right"))
        ids = torch.cat([pad(rows, padding_value=0, padding_side=side) for rows, side in sides], dim=1)
        masks = [pad([torch.ones_like(r) for r in rows], padding_value=0, padding_side=side) for rows, side in sides]
        mask = torch.cat(masks, dim=1)
        batches.append({"input_ids": ids, "attention_mask": mask, "logits_to_keep": int(replies.max())})
    return batches


class LogProbPasses:
    """A step of this task (`flatcollate.bench.timing.run_pass`): the trainer's per-token log-probabilities of a
    batch's completions, without gradients; the loss is their mean negative log-probability. Nothing to reset."""

    def __init__(self, trainer):
        self.trainer = trainer

    def reset(self) -> None:
        pass

    def __call__(self, inputs: dict) -> float:
        mask, width = inputs["attention_mask"], inputs["logits_to_keep"]
        with torch.no_grad():
            logps, _, _ = self.trainer._get_per_token_logps_and_entropies(
                self.trainer.model, inputs["input_ids"], mask, width
            )
        scored = mask[:, -width:].to(logps.dtype)
        return -float((logps * scored).sum() / scored.sum())


def measure(config: PairBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: build the model and `GRPOTrainer` (`padded`) or `FlatGRPOTrainer` (`flattened`, which prepares it),
    then warm up and time the log-prob passes of the timed batches (`flatcollate.bench.timing.timed_pass`)."""
    import datasets
    import transformers
    import trl

    from ...integrations.trl import FlatGRPOTrainer
    from ...synthetic import offline_tokenizer

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    model = build_on_device(
        AutoModelForCausalLM, model_config(config), device=device, dtype=config.dtype, seed=config.seed
    )
    summary, vocab_size, rows = model_summary(model), model.config.vocab_size, GENERATIONS * config.batch_size
    draw = draw_pairs(config, whole=True)
    batches = grpo_batches(draw, batch_size=config.batch_size, vocab_size=vocab_size, seed=config.seed)
    with tempfile.TemporaryDirectory() as out:
        options = {"per_device_train_batch_size": rows, "num_generations": GENERATIONS, "report_to": []}
        trainer = {"padded": trl.GRPOTrainer, "flattened": FlatGRPOTrainer}[mode](
            model=model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=trl.GRPOConfig(out, use_cpu=device.type == "cpu", bf16=False, seed=config.seed, **options),
            train_dataset=datasets.Dataset.from_list([{"prompt": "t1"}] * rows),
            processing_class=offline_tokenizer(vocab_size),
        )
    warm = config.warmup_steps
    figures = timed_pass(LogProbPasses(trainer), batches[warm:], batches[:warm], device=device)
    return {
        **figures,
        "attn": trainer.model.config._attn_implementation,
        "pass_flops": step_flops(model, scored=timed_lengths(config, draw)),
        "model": summary,
        "environment": {},
    }


TASK = pair_task(
    "grpo",
    padded="GRPOTrainer",
    flattened="FlatGRPOTrainer",
    measure=measure,
    whole=True,
    step="one log-prob pass without gradients over a batch (GRPO's reference and old-policy pass); a pair is a "
    "prompt with its two completions; the loss is the mean negative log-probability of the completion tokens",
    layout=padded_grpo_tokens,
    pair="a prompt with two completions (its chosen and its rejected reply, each + eos)",
    padding="prompts left-padded to the longest prompt, completions right-padded to the longest completion",
    verb="scores",
)
