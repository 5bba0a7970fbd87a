"""`flatcollate check --task dpo|reward`: the per-sequence outputs that training after SFT reads, on a flattened row.

- `dpo`: each sequence's log-probabilities of its completion (the second half of each sequence), per token, as
  `flatcollate.preference.sequence_logprobs` computes them for `FlatDPOTrainer` and `FlatGRPOTrainer`, and the
  gradients of their sum, against each sequence run alone;
- `reward`: each sequence's score from a sequence-classification head (`sequence_scores`, what `FlatRewardTrainer`
  reads) and the gradients of their sum, against each sequence alone through the model's own forward.

The row's lengths come from the config as for the `sft` check (`flatcollate.check.lengths`), its tokens are random.
In the report, `max logit diff` is the largest per-token log-probability (or score) gap and `loss diff` the gap of
their sum. Image-text families take `dpo` through `flatcollate.check.vision` (examples with images,
`flatcollate.check.vision_tasks`), with `run_logprobs` and `logprobs_alone` from here; `reward` takes text families.
"""

import copy
import itertools

import torch
from transformers import AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

from .._conventions import IGNORE_INDEX
from ..families import family_of
from ..modeling import prepare_model_for_flattening, unsupported_reason
from ..preference.logprobs import flattened_logprobs
from ..preference.scores import classifier_parts, prepare_reward_model, sequence_scores
from ..testing import tiny_causal_lm, tiny_config
from .lengths import plan_check
from .report import BackendResult, CheckReport
from .runs import Outputs, compare_backends, example_alone, gradients
from .text import flattened_inputs

TASKS = ("sft", "dpo", "reward")
"""What a check proves: the causal-LM loss (`sft`), per-sequence log-probabilities (`dpo`), reward scores (`reward`)."""


def check_task_model(
    model: str | PretrainedConfig,
    *,
    task: str,
    backends: tuple[str, ...],
    lengths: tuple[int, ...] | None = None,
    seed: int = 0,
    tolerance: float | None = None,
    overrides: dict | None = None,
) -> CheckReport:
    """`check_model` for `task="dpo"` or `"reward"` (fp32 CPU, a tiny copy built from the config).

    >>> check_task_model("llama", task="dpo", backends=("flatcollate",), lengths=(5, 1, 7)).results[0].status
    'exact'
    """
    if task not in ("dpo", "reward"):
        raise ValueError(f"task must be 'dpo' or 'reward' here, got {task!r} (the 'sft' check is `check_model`).")
    if isinstance(model, PreTrainedModel):
        raise TypeError(f"the {task} check builds a tiny copy from the config: pass the model's config or model_type.")
    config = tiny_config(model, **(overrides or {}))
    stateful = bool(family_of(getattr(config, "model_type", "")).mixers)
    plan = plan_check(config, lengths=lengths, stateful=stateful, shrink=True)
    options = {**(overrides or {}), **plan.overrides}
    value = 1e-5 if tolerance is None else tolerance
    if task == "reward" and type(config) not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
        reason = f"transformers has no sequence-classification model for {config.model_type}"
        results = [BackendResult(backend=backend, status="unsupported", reason=reason) for backend in backends]
        return CheckReport(model_type=config.model_type, lengths=tuple(plan.lengths), tolerance=value, results=results)
    base = _reward_model(model, seed, options) if task == "reward" else _causal_lm(model, seed, options)
    batch = flattened_inputs(tuple(plan.lengths), base.config.vocab_size, seed)
    if task == "dpo":
        batch["labels"] = _completion_labels(batch)
        run, prepare, unsupported = run_logprobs, prepare_model_for_flattening, unsupported_reason
        reference = logprobs_alone(base, _examples(batch))
    else:
        run, prepare, unsupported = _run_scores, prepare_reward_model, _backbone_reason
        reference = _scores_alone(base, batch)
    tolerances = {"logits_diff": value, "loss_diff": value, "grad_diff": value}
    results, _ = compare_backends(
        base, batch, backends, reference, tolerances, run=run, prepare=prepare, unsupported=unsupported
    )
    what = "completion log-probabilities per sequence" if task == "dpo" else "one score per sequence (last token)"
    return CheckReport(
        model_type=base.config.model_type,
        lengths=tuple(plan.lengths),
        tolerance=value,
        results=results,
        exercised={"task": f"{task}: {what}", **plan.exercised},
        overrides=plan.overrides,
        tolerances=tolerances,
    )


def _causal_lm(model, seed: int, overrides: dict) -> PreTrainedModel:
    return tiny_causal_lm(model, attn_implementation="eager", seed=seed, **overrides)


def _reward_model(model, seed: int, overrides: dict) -> PreTrainedModel:
    """A tiny `*ForSequenceClassification` with one label and no pad token (every sequence pools at its last token)."""
    config = tiny_config(model, **overrides)
    config.num_labels, config.pad_token_id = 1, None
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation="eager").eval()


def _backbone_reason(model: PreTrainedModel) -> str | None:
    return unsupported_reason(classifier_parts(model)[1])


def _completion_labels(batch: dict) -> torch.Tensor:
    """Labels of the second half of each sequence (its completion), -100 on the first half (its prompt)."""
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    bounds = batch["cu_seq_lens_q"].tolist()
    for start, end in itertools.pairwise(bounds):
        middle = start + (end - start) // 2
        labels[0, middle:end] = batch["input_ids"][0, middle:end]
    return labels


def _examples(batch: dict) -> list[dict[str, torch.Tensor]]:
    """The sequences of a flattened text row as examples: `input_ids` and `labels`, each `(L,)`."""
    bounds = batch["cu_seq_lens_q"].tolist()
    return [
        {"input_ids": batch["input_ids"][0, start:end], "labels": batch["labels"][0, start:end]}
        for start, end in itertools.pairwise(bounds)
    ]


def run_logprobs(model: PreTrainedModel, batch: dict) -> Outputs:
    """`sequence_logprobs` per token on a flattened batch (text or image-text), their sum and its gradients."""
    model.zero_grad(set_to_none=True)
    per_token = torch.cat(flattened_logprobs(model, batch, per_token=True))
    total = per_token.sum()
    total.backward()
    return per_token.detach(), total.detach(), gradients(model)


def logprobs_alone(model: PreTrainedModel, examples: list[dict]) -> Outputs:
    """Reference: each example alone (its own images, if any), the log-probability of each next token it labels, 0
    elsewhere: `(sum of (L - 1),)` fp32 in example order, their sum and its gradients (on a copy of `model`)."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    values = []
    for example in examples:  # one forward per example, never across
        logps = torch.log_softmax(model(**example_alone(example), use_cache=False).logits[0].float(), dim=-1)
        targets = example["labels"][1:]
        picked = logps[:-1].gather(-1, targets.clamp(min=0)[:, None])[:, 0]
        values.append(torch.where(targets != IGNORE_INDEX, picked, torch.zeros_like(picked)))
    per_token = torch.cat(values)
    total = per_token.sum()
    total.backward()
    return per_token.detach(), total.detach(), gradients(model)


def _run_scores(model: PreTrainedModel, batch: dict) -> Outputs:
    model.zero_grad(set_to_none=True)
    scores = sequence_scores(model, batch)
    total = scores.sum()
    total.backward()
    return scores.detach().float(), total.detach().float(), gradients(model)


def _scores_alone(model: PreTrainedModel, batch: dict) -> Outputs:
    """Reference: each sequence alone through the model's own forward (it pools at the last token)."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    scores = torch.cat([model(**example_alone(e), use_cache=False).logits for e in _examples(batch)])
    total = scores.sum()
    total.backward()
    return scores.detach().float(), total.detach().float(), gradients(model)
