"""Image-text models through `transformers.Trainer` and TRL with their DEFAULT `remove_unused_columns=True`.

`Trainer` keeps only the dataset columns the model's forward names; a flattened VLM batch needs the vision fields
(`pixel_values`, `image_grid_thw`, `image_sizes`, ...), the per-token types (`mm_token_type_ids`, `token_type_ids`) and
the labels or masks. One SGD step (lr 1, no clipping: any change of the gradient shows in the parameters) must move
the parameters exactly as the per-example reference step does, with the same normalisation (token-weighted mean of the
batch). TRL's `SFTTrainer` refuses `padding_free=True` for rows with images and, on rows already encoded, keeps only
`input_ids` and `labels`: its padding-free batches lose the images without an error. `FlatSFTTrainer` collates encoded
rows with `VisionDataCollatorWithFlattening` and keeps the fields.
"""

import copy
import math
import tempfile

import datasets
import PIL.Image
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from trl import SFTConfig, SFTTrainer

from flatcollate import prepare_model_for_flattening
from flatcollate._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from flatcollate.check.vision import exact_within
from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.testing.tiny_vision import VOCAB_SIZE, tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

from ..data.test_vision_encode import ImageOnlyQwen2VLProcessor
from ..vision.test_flattened_exact import separate_run

pytestmark = pytest.mark.slow

TOL = 1e-5
FAMILIES = ["qwen2_5_vl", "gemma3", "idefics3"]  # mRoPE grid; image blocks and token types; tiles on dimension 1
ONE_STEP = {"max_steps": 1, "optim": "sgd", "learning_rate": 1.0, "lr_scheduler_type": "constant", "max_grad_norm": 0}
COMMON = {"report_to": [], "use_cpu": True, "save_strategy": "no", "disable_tqdm": True, "seed": 0}


class Recording:
    """A collator that keeps every batch it makes (a test looks at what the model was given)."""

    def __init__(self, collator):
        self.collator, self.batches = collator, []

    def __call__(self, features):
        self.batches.append(self.collator(features))
        return self.batches[-1]


class GradientsBeforeTheStep(TrainerCallback):
    """Keeps the gradients the optimizer is about to apply (the trainer zeroes them after the step)."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def as_dataset(examples: list[dict], *, labels_as: str = "labels") -> datasets.Dataset:
    """The examples as a map-style dataset in torch format (float32 pixels, int64 ids); `labels_as="completion_mask"`
    stores 1 where the example trains instead of `labels`, for the collator to fold back."""
    rows = []
    for example in examples:
        row = {key: value.tolist() for key, value in example.items()}
        if labels_as == "completion_mask":
            row["completion_mask"] = [int(label != -100) for label in row.pop("labels")]
        rows.append(row)
    return datasets.Dataset.from_list(rows).with_format("torch")


def reference_step(model, examples: list[dict]) -> tuple[dict, dict]:
    """Gradients of the token-weighted loss of each example run alone, and the parameters one SGD step (lr 1)
    makes of them."""
    model = copy.deepcopy(model)
    *_, grads = separate_run(model, examples)
    params = {name: p.detach() - grads[name] if name in grads else p.detach() for name, p in model.named_parameters()}
    return grads, params


def assert_close_to(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Within `exact_within` the tensor's largest entry (1e-5, or eight fp32 roundings where coarser): Gemma 3's
    image projection has gradients of about 140, where one rounding step is already 1.5e-5 and TRL's chunked loss
    sums in another order."""
    worst, bound = (got - expected).abs().max().item(), exact_within(expected.abs().max().item())
    assert worst <= bound, f"{what} differs from the per-example reference by {worst:.3g} (allowed {bound:.3g})"


def assert_same_step(model, recorded: GradientsBeforeTheStep, reference: tuple[dict, dict], family: str) -> None:
    """The gradients the optimizer applied, and the parameters after the step, equal the per-example reference's."""
    grads, params = reference
    assert recorded.grads.keys() == grads.keys()
    got = dict(model.named_parameters())
    assert got.keys() == params.keys()
    for name, value in grads.items():
        assert_close_to(recorded.grads[name], value, f"{family}: gradient of {name}")
    for name, value in params.items():
        assert_close_to(got[name].detach(), value, f"{family}: {name} after the step")


def needed_fields(examples: list[dict]) -> set[str]:
    """The vision and token-type fields the examples carry: every one must reach the model."""
    return {key for example in examples for key in example if key in (*IMAGE_FIELDS, *TOKEN_TYPE_FIELDS)}


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(request):
    model = tiny_vision_lm(request.param)
    return request.param, model, tiny_vision_examples(model, count=4, seed=1)  # 1, 2, 0, 1 images


# ---- transformers.Trainer --------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels_as", ["labels", "completion_mask"])
def test_trainer_step_equals_the_per_example_step(family_case, labels_as):
    family, model, examples = family_case
    reference = reference_step(model, examples)
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    collator, recorded = Recording(VisionDataCollatorWithFlattening.from_model(prepared)), GradientsBeforeTheStep()
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, **ONE_STEP, **COMMON)
        assert args.remove_unused_columns  # the default, under test
        dataset = as_dataset(examples, labels_as=labels_as)
        trainer = Trainer(prepared, args, train_dataset=dataset, data_collator=collator, callbacks=[recorded])
        trainer.train()
    (batch,) = collator.batches
    assert needed_fields(examples) | {"labels"} <= set(batch), sorted(batch)
    assert trainer.state.global_step == 1
    assert_same_step(prepared, recorded, reference, family)


def padded_collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """The padded batch of the same examples (families whose vision fields stack on dimension 0): per-token fields
    right-padded to the longest (ids 0, labels -100, types 0), `attention_mask`, vision fields concatenated."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key, pad in (("input_ids", 0), ("labels", -100), *((k, 0) for k in TOKEN_TYPE_FIELDS)):
        if key in features[0]:
            padded = [torch.nn.functional.pad(f[key], (0, longest - len(f[key])), value=pad) for f in features]
            batch[key] = torch.stack(padded)
    batch["attention_mask"] = torch.stack([(torch.arange(longest) < len(f["input_ids"])).long() for f in features])
    for key in IMAGE_FIELDS:
        parts = [f[key] for f in features if f.get(key) is not None]
        if parts:
            batch[key] = torch.cat(parts)
    return batch


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_optimizer_steps_and_losses_equal_the_padded_run(family):
    model = tiny_vision_lm(family)
    examples = tiny_vision_examples(model, count=5, seed=2)
    runs = {}
    for mode in ("padded", "flattened"):
        candidate = copy.deepcopy(model)
        if mode == "flattened":
            prepare_model_for_flattening(candidate)
        collator = VisionDataCollatorWithFlattening.from_model(candidate) if mode == "flattened" else padded_collate
        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(tmp, per_device_train_batch_size=2, num_train_epochs=1, logging_steps=1, **COMMON)
            trainer = Trainer(candidate, args, train_dataset=as_dataset(examples), data_collator=collator)
            trainer.train()
        runs[mode] = (trainer.state.global_step, [log["loss"] for log in trainer.state.log_history if "loss" in log])
    assert runs["flattened"][0] == runs["padded"][0] == math.ceil(5 / 2)
    gap = max(abs(a - b) for a, b in zip(runs["flattened"][1], runs["padded"][1], strict=True))
    assert gap <= TOL, runs


# ---- TRL --------------------------------------------------------------------------------------------------------


def word_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """An in-memory tokenizer over the tiny models' vocabulary (the encoded rows never go through it)."""
    vocab = {f"t{i}": i for i in range(vocab_size - 2)} | {"<pad>": vocab_size - 2, "<eos>": vocab_size - 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>", eos_token="<eos>"
    )


def sft_config(tmp, **overrides) -> SFTConfig:
    options = {"padding_free": True, "max_length": None, "per_device_train_batch_size": 4, **ONE_STEP, **overrides}
    return SFTConfig(output_dir=tmp, bf16=False, **COMMON, **options)


def test_trl_padding_free_drops_the_images_of_encoded_rows():
    """What TRL 1.16 does with rows a processor encoded: its signature columns keep `input_ids` and `labels` only,
    so `SFTTrainer(padding_free=True)` trains on the placeholder tokens without their images, without an error."""
    model = tiny_vision_lm("qwen2_5_vl")
    examples = tiny_vision_examples(model, count=4, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = SFTTrainer(
            model=model, args=sft_config(tmp), train_dataset=as_dataset(examples), processing_class=word_tokenizer()
        )
        batch = next(iter(trainer.get_train_dataloader()))
    assert not needed_fields(examples) & set(batch), sorted(batch)


@pytest.mark.parametrize(("family", "given"), [("qwen2_5_vl", False), ("qwen2_5_vl", True), ("gemma3", False)], ids=str)
def test_flat_sft_trainer_step_equals_the_per_example_step(family, given):
    """TRL's own loss (its fused LM head on the backbone, token-weighted over the batch) on the flattened batch."""
    model = tiny_vision_lm(family)
    examples = tiny_vision_examples(model, count=4, seed=1)
    reference = reference_step(model, examples)
    options = {"data_collator": VisionDataCollatorWithFlattening.from_model(model)} if given else {}
    recorded = GradientsBeforeTheStep()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = FlatSFTTrainer(
            model=model,
            args=sft_config(tmp),
            train_dataset=as_dataset(examples),
            processing_class=word_tokenizer(),
            callbacks=[recorded],
            **options,
        )
        assert isinstance(trainer.data_collator, VisionDataCollatorWithFlattening)
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.train()
    assert needed_fields(examples) | {"labels"} <= set(batch), sorted(batch)
    assert trainer.state.global_step == 1
    assert_same_step(model, recorded, reference, family)


def image_rows(count: int = 2) -> datasets.Dataset:
    parts = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": "Red."}]},
    ]
    return datasets.Dataset.from_list(
        [{"messages": messages, "images": [PIL.Image.new("RGB", (28, 28), "red")]}] * count
    )


def test_flat_sft_trainer_refuses_rows_with_images_naming_the_encoder():
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError) as caught:
        FlatSFTTrainer(
            model=tiny_vision_lm("qwen2_5_vl"),
            args=sft_config(tmp),
            train_dataset=image_rows(),
            processing_class=word_tokenizer(),
        )
    message = str(caught.value)
    assert "'images'" in message and "make_supervised_dataset(processor" in message, message


def test_trl_refuses_padding_free_for_rows_with_images(tokenizer_dir):
    """The refusal `FlatSFTTrainer` explains: TRL processes images in its own collator, one padded batch at a time."""
    processor = ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56),
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct")),
    )
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError, match="Padding-free training is yet not"):
        SFTTrainer(
            model=tiny_vision_lm("qwen2_5_vl"),
            args=sft_config(tmp),
            train_dataset=image_rows(),
            processing_class=processor,
        )


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_flat_sft_trainer_packs_image_text_rows(family, caplog):
    """`packing=True` with an image-text model, which TRL refuses or packs without the images: the encoded rows are
    packed with their images by `pack_dataset`, the step over every pack equals the per-example step, and the trainer
    says what it packed."""
    model = tiny_vision_lm(family)
    examples = tiny_vision_examples(model, count=4, seed=1)
    reference = reference_step(model, examples)
    lengths = [len(example["input_ids"]) for example in examples]
    pack_len = max(max(lengths), math.ceil(sum(lengths) / 2))
    recorded = GradientsBeforeTheStep()
    config = {"padding_free": False, "packing": True, "packing_strategy": "bfd", "max_length": pack_len}
    with tempfile.TemporaryDirectory() as tmp, caplog.at_level("INFO", logger="flatcollate.integrations.trl.sft"):
        trainer = FlatSFTTrainer(
            model=model,
            args=sft_config(tmp, **config),
            train_dataset=as_dataset(examples),
            processing_class=word_tokenizer(),
            callbacks=[recorded],
        )
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.train()
    stats = trainer.packing_stats
    assert stats.num_sequences == 4 and 2 <= stats.num_packs < 4 and len(trainer.train_dataset) == stats.num_packs
    assert f"packed 4 image-text rows into {stats.num_packs} packs of <= {pack_len} tokens" in caplog.text
    assert needed_fields(examples) | {"labels"} <= set(batch), sorted(batch)
    assert batch["cu_seq_lens_q"].numel() == 5  # the four examples, each its own sequence
    assert trainer.state.global_step == 1
    assert_same_step(model, recorded, reference, family)


def test_optimizer_steps_follow_the_packs():
    """One pack per device batch: an epoch takes one optimizer step per pack, as with text packing."""
    model = tiny_vision_lm("qwen2_5_vl")
    examples = tiny_vision_examples(model, count=6, seed=2)
    pack_len = max(len(example["input_ids"]) for example in examples)
    config = {"packing": True, "max_length": pack_len, "per_device_train_batch_size": 1}
    with tempfile.TemporaryDirectory() as tmp:
        args = sft_config(tmp, **config, padding_free=False, max_steps=-1, num_train_epochs=1)
        trainer = FlatSFTTrainer(
            model=model, args=args, train_dataset=as_dataset(examples), processing_class=word_tokenizer()
        )
        trainer.train()
    assert 1 < trainer.packing_stats.num_packs < 6
    assert trainer.state.global_step == trainer.packing_stats.num_packs
    assert args.packing and not trainer.args.packing  # the user's config is left as given


def test_flat_sft_trainer_refuses_an_overlong_example_with_images():
    model = tiny_vision_lm("qwen2_5_vl")
    examples = tiny_vision_examples(model, count=2, seed=1)
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError, match=r"row 1 .* carries images"):
        FlatSFTTrainer(
            model=model,
            args=sft_config(tmp, padding_free=False, packing=True, max_length=len(examples[1]["input_ids"]) - 1),
            train_dataset=as_dataset(examples),
            processing_class=word_tokenizer(),
        )
