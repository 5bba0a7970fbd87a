"""`check_model`: is a model exact on flattened batches, per attention backend? Text families are checked with
random tokens (`flatcollate.check.text`), image-text-to-text families with images (`flatcollate.check.vision`)."""

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .report import CheckReport
from .tasks import check_task_model
from .text import DEFAULT_BACKENDS, check_text_model
from .vision import check_vision_model, image_text_model_type


def check_model(
    model: str | PretrainedConfig | PreTrainedModel,
    *,
    backends: tuple[str, ...] = DEFAULT_BACKENDS,
    lengths: tuple[int, ...] | None = None,
    seed: int = 0,
    tolerance: float | None = None,
    overrides: dict | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    task: str = "sft",
) -> CheckReport:
    """Compare a flattened batch with the same sequences run one at a time, per attention backend.

    Args:
        model: a `model_type` (`"llama"`), a folder with a `config.json`, a config (each shrunk by
            `flatcollate.testing.tiny_config`), or a model (copied, used at its size in fp32). An image-text-to-text
            architecture (qwen2_vl, llava, ...) is checked with images (`flatcollate.check.vision`): its family's
            tiny recipe, examples with 1, 2 and 0 images, fp32 CPU (`lengths`, `overrides`, `device`, `dtype` unset).
        backends (`tuple[str, ...]`): `"sdpa"` and `"eager"` run transformers' own backends with `use_cache=False`
            and no `attention_mask`; `"flatcollate"` runs `prepare_model_for_flattening`.
        lengths (`tuple[int, ...]`, *optional*): sequence lengths of the flattened row; at least two, so the row has
            a boundary. By default they come from the config (`flatcollate.check.lengths.plan_check`): one sequence
            longer than every sliding window or attention chunk it declares (a window too long for a CPU check is
            shrunk in the tiny copy, and the report says so), a length-1 sequence and an odd length.
        seed (`int`): seed of the weights and tokens.
        tolerance (`float`, *optional*): largest absolute difference of logits, loss and gradients that counts as
            exact. Defaults to 1e-5 in fp32 on the CPU; otherwise, per quantity, to twice the error of the per-sequence
            run in the same dtype and device against the fp32 CPU reference (the rule of flash-attn's own tests), and
            at least the dtype's resolution at the quantity's size: as inexact as the precision, never more.
        device (`str` or `torch.device`): where the candidate runs (`"cuda"` reaches the flash-attn / varlen
            kernels); the fp32 reference always runs on the CPU.
        dtype (`torch.dtype`): dtype of the candidate (`torch.bfloat16`, `torch.float16`, `torch.float32`).
        overrides (`dict`, *optional*): config attributes for the tiny model, e.g. `{"sliding_window": 4}`.
        task (`str`, defaults to `"sft"`): what is compared: the causal-LM logits, loss and gradients (`"sft"`), each
            sequence's completion log-probabilities (`"dpo"`, what `FlatDPOTrainer` and `FlatGRPOTrainer` read) or
            its reward score (`"reward"`, what `FlatRewardTrainer` reads); see `flatcollate.check.tasks`. Both run in
            fp32 on the CPU; `"dpo"` takes image-text families too (their examples with 1, 2 and 0 images,
            `flatcollate.check.vision_tasks`), `"reward"` text families only.

    Returns:
        `CheckReport`, one `BackendResult` per backend.

    >>> report = check_model("llama", backends=("flatcollate",), lengths=(3, 1, 4))
    >>> report.passed, report.results[0].status
    (True, 'exact')
    """
    options = {"backends": backends, "lengths": lengths, "seed": seed, "tolerance": tolerance, "overrides": overrides}
    image_text = image_text_model_type(model.config if isinstance(model, PreTrainedModel) else model) is not None
    if task != "sft" and (torch.device(device).type != "cpu" or dtype != torch.float32):
        raise ValueError(f"task={task!r} runs in float32 on the CPU; leave `device` and `dtype` unset.")
    if task != "sft" and not image_text:
        return check_task_model(model, task=task, **options)
    options |= {"device": device, "dtype": dtype}
    if image_text:
        return check_vision_model(model, task=task, **options)
    return check_text_model(model, **options)
