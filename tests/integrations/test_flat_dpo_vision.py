"""One optimizer step of `FlatDPOTrainer` on image-text preference pairs equals `DPOTrainer`'s padded vision step:
loss, the logged metrics (rewards, margins, accuracies, log-probs, entropy) and every parameter after one SGD step
(vision tower included), fp32 CPU, within 1e-5, for Qwen2-VL and Qwen2.5-VL (mRoPE, `mm_token_type_ids`) and Gemma 3
(image blocks attending both ways, `token_type_ids`). Tiny models with the Qwen2.5 tokenizer's vocabulary and the
processor's multimodal token ids; each family's real processor class and PIL image processor built offline on the
Qwen2.5 tokenizer (Qwen2-VL's and Qwen2.5-VL's through `images_only`); a reference model with other weights. The pairs
hold 1, 2, 1 and 1 images of four sizes (Gemma 3 resizes every image to one size); pairs 0 and 2 have images of one
size::

    TRL          prompts + images processed as a batch, left-padded, completions right-padded, flushed left
    flattened    [p0 c0 | p1 c1 | p2 c2 | p3 c3 | p0 r0 | p1 r1 | p2 r2 | p3 r3]    images img0 img1 img2 img3 twice

Controls: pairs 0 and 2 given each other's image, or a boundary one token late, change the step.
"""

import copy
import itertools
import tempfile
from dataclasses import dataclass

import datasets
import numpy as np
import PIL.Image
import pytest
import torch
from transformers import (
    AutoModelForImageTextToText,
    AutoTokenizer,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)

from flatcollate.integrations.trl import FlatDPOTrainer
from flatcollate.preference import VisionDataCollatorForPreference
from flatcollate.testing.tiny_vision import WEIGHT_NOISE, tiny_vision_config, tiny_vision_lm
from flatcollate.vision import images_only

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
TOL = 1e-5
CHANGED = 1e-4
METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "entropy",
    "num_tokens",
    "grad_norm",
)
GEMMA_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


@dataclass(frozen=True)
class Family:
    image: str  # what a prompt writes for one image (the processor expands it)
    tokens: dict[str, str]  # config attribute -> the processor's token
    token_types: str
    patch_embedding: str  # the vision tower's first weight: it moves only if the images train


QWEN_VL = Family(  # Qwen2-VL and Qwen2.5-VL write and read images alike
    image="<|vision_start|><|image_pad|><|vision_end|>",
    tokens={
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    },
    token_types="mm_token_type_ids",
    patch_embedding="model.visual.patch_embed.proj.weight",
)
FAMILIES = {
    "qwen2_vl": QWEN_VL,
    "qwen2_5_vl": QWEN_VL,
    "gemma3": Family(
        image="<start_of_image>",
        tokens={
            "boi_token_index": "<start_of_image>",
            "eoi_token_index": "<end_of_image>",
            "image_token_index": "<image_soft_token>",
        },
        token_types="token_type_ids",
        patch_embedding="model.vision_tower.embeddings.patch_embedding.weight",
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def processor(family, tokenizer_dir):
    """The family's processor sized for its tiny vision tower: Qwen2-VL's and Qwen2.5-VL's with patch 4, merge 2 (an
    image of h x w pixels fills h * w / 64 placeholders); Gemma 3's at 32 x 32 pixels, 4 placeholders per image."""
    path = tokenizer_dir("qwen2.5-instruct")
    if family == "gemma3":
        tokenizer = AutoTokenizer.from_pretrained(path, extra_special_tokens=GEMMA_TOKENS)
        image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
        return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4)
    image_processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, min_pixels=8 * 8, max_pixels=32 * 32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    processor_class = Qwen2VLProcessor if family == "qwen2_vl" else Qwen2_5_VLProcessor
    return images_only(processor_class)(image_processor=image_processor, tokenizer=tokenizer)


def tiny_model(family: str, processor, seed: int):
    """`tiny_vision_lm(family)` with the processor's vocabulary and multimodal token ids."""
    tokenizer = processor.tokenizer
    config = tiny_vision_config(family)
    config.text_config.vocab_size = len(tokenizer)
    config.text_config.pad_token_id = tokenizer.pad_token_id
    for name, token in FAMILIES[family].tokens.items():
        setattr(config, name, tokenizer.convert_tokens_to_ids(token))
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator), alpha=WEIGHT_NOISE)
    return model


def image(rng, height: int, width: int) -> PIL.Image.Image:
    return PIL.Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def pairs(family):
    image_text = FAMILIES[family].image
    rng = np.random.default_rng(0)
    rows = [
        {
            "images": [image(rng, 16, 16)],
            "prompt": f"{image_text}What is this?",
            "chosen": " A cat.",
            "rejected": " A dog.",
        },
        {
            "images": [image(rng, 16, 24), image(rng, 24, 16)],
            "prompt": f"Compare {image_text} and {image_text}, please.",
            "chosen": " The first is wider, the second taller.",
            "rejected": " They are the same.",
        },
        {
            "images": [image(rng, 16, 16)],
            "prompt": f"Describe {image_text}",
            "chosen": " Noise.",
            "rejected": " Hills.",
        },
        {
            "images": [image(rng, 24, 24)],
            "prompt": f"{image_text} Colours?",
            "chosen": " Many.",
            "rejected": " Red only.",
        },
    ]
    return datasets.Dataset.from_list(rows)


def one_step(trainer_class, family, processor, pairs):
    """Parameters after one SGD step and the logged metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        args = trl.DPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=4,
            max_steps=1,
            learning_rate=0.5,
            optim="sgd",
            lr_scheduler_type="constant",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=0,
            disable_tqdm=True,
            logging_steps=1,
            save_strategy="no",
            train_sampling_strategy="sequential",
        )
        trainer = trainer_class(
            model=tiny_model(family, processor, seed=0),
            ref_model=tiny_model(family, processor, seed=1),
            args=args,
            train_dataset=pairs,
            processing_class=processor,
        )
        if trainer_class is FlatDPOTrainer:
            assert isinstance(trainer.data_collator, VisionDataCollatorForPreference)
        trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return params, trainer.state.log_history[0]


@pytest.fixture(scope="module")
def padded_step(family, processor, pairs):
    return one_step(trl.DPOTrainer, family, processor, pairs)


def largest_gap(params, expected) -> float:
    assert params.keys() == expected.keys()
    return max((expected[name] - p).abs().max().item() for name, p in params.items())


def test_the_collator_lays_out_trls_padded_batch_without_padding(family, processor, pairs):
    """Sequence k of the row is row k of TRL's padded batch (ids, completion mask, token types), and the vision
    fields are TRL's, in the same order."""
    examples = [dict(row) for row in pairs]
    batch = VisionDataCollatorForPreference.from_model(tiny_model(family, processor, seed=0), processor)(examples)
    padded = trl.trainer.dpo_trainer.DataCollatorForVisionPreference(processor=processor)(copy.deepcopy(examples))
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, int(padded["attention_mask"].sum()))
    bounds = batch["cu_seq_lens_q"].tolist()
    assert len(bounds) == 2 * len(examples) + 1
    for k, (start, end) in enumerate(itertools.pairwise(bounds)):
        real = padded["attention_mask"][k].bool()
        for key in ("input_ids", "completion_mask", FAMILIES[family].token_types):
            assert torch.equal(batch[key][0, start:end], padded[key][k][real]), (key, k)
    vision = sorted(padded.keys() - {"input_ids", "attention_mask", "completion_mask", FAMILIES[family].token_types})
    assert "pixel_values" in vision and sorted(batch.keys() & padded.keys()) == sorted(
        padded.keys() - {"attention_mask"}
    )
    for key in vision:
        torch.testing.assert_close(batch[key], padded[key], rtol=0, atol=0)


def test_one_step_equals_dpo_trainers_padded_vision_step(family, processor, pairs, padded_step):
    expected, expected_logs = padded_step
    got, logs = one_step(FlatDPOTrainer, family, processor, pairs)
    for key in METRICS:
        assert abs(logs[key] - expected_logs[key]) <= TOL, (key, logs[key], expected_logs[key])
    assert largest_gap(got, expected) <= TOL
    name = FAMILIES[family].patch_embedding
    before = dict(tiny_model(family, processor, seed=0).named_parameters())[name]
    assert (got[name] - before).abs().max() > CHANGED, "the vision tower did not train"


def test_swapping_two_pairs_images_changes_the_step(family, processor, pairs, padded_step):
    """Negative control: pairs 0 and 2 given each other's image (same size, so every count still matches)."""
    expected, expected_logs = padded_step
    swapped = pairs.to_list()
    swapped[0]["images"], swapped[2]["images"] = swapped[2]["images"], swapped[0]["images"]
    swapped = datasets.Dataset.from_list(swapped, features=pairs.features)
    got, logs = one_step(FlatDPOTrainer, family, processor, swapped)
    assert abs(logs["logps/chosen"] - expected_logs["logps/chosen"]) > CHANGED
    assert largest_gap(got, expected) > CHANGED


def test_a_shifted_boundary_changes_the_step(family, processor, pairs, padded_step, monkeypatch):
    """Negative control: the first boundary one token late (pair 1's first token scored as pair 0's last)."""
    expected, expected_logs = padded_step
    call = VisionDataCollatorForPreference.__call__

    def shifted(self, examples):
        batch = call(self, examples)
        bounds = batch["cu_seq_lens_q"].clone()
        bounds[1] += 1
        batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = bounds
        positions = batch["position_ids"][0]
        positions[int(bounds[1]) - 1] = positions[int(bounds[1]) - 2] + 1
        positions[int(bounds[1]) : int(bounds[2])] -= 1
        return batch

    monkeypatch.setattr(VisionDataCollatorForPreference, "__call__", shifted)
    got, logs = one_step(FlatDPOTrainer, family, processor, pairs)
    assert abs(logs["logps/chosen"] - expected_logs["logps/chosen"]) > CHANGED
    assert largest_gap(got, expected) > CHANGED


def test_image_rows_on_an_untested_family_are_refused(processor, pairs):
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError, match=r"'llava'\. Use trl\.DPOTrainer"):
        FlatDPOTrainer(
            model=tiny_vision_lm("llava"),
            args=trl.DPOConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False),
            train_dataset=pairs,
            processing_class=processor,
        )
