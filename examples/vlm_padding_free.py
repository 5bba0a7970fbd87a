"""Train a tiny Qwen2.5-VL-shaped model padding-free on conversations with images, with `transformers.Trainer`.

    python examples/vlm_padding_free.py                                     # 16 conversations, batches of 4
    python examples/vlm_padding_free.py --num-examples 32 --batch-size 8
    python examples/vlm_padding_free.py --processor path/to/Qwen2.5-VL-3B-Instruct  # a local model's processor

Rows are conversations (`messages` with `{"type": "image"}` parts) with generated images of random sizes (`images`),
encoded by `make_supervised_dataset(processor, ...)`: one processor call per row expands each image into its
placeholder tokens, and only the assistant replies are trained. The processor is Qwen2.5-VL's, built offline from the
Qwen2.5 tokenizer in the shared data (`$FLATCOLLATE_SHARED_DATA`, default `../shared/data` beside the checkout) and
Qwen2-VL's image processor (which Qwen2.5-VL uses), by `flatcollate.vision.images_only(Qwen2_5_VLProcessor)`: the
class without its video slot, whose processor needs torchvision. `--processor DIR` reads a local model directory's
processor instead (`flatcollate.vision.load_processor`: transformers' own `AutoProcessor` where torchvision is
installed). Without either, encoded rows from `flatcollate.testing.tiny_vision_examples` stand in, and the output says
so. The model is built from a config (random weights, no download): 2 text layers of width 64 over the tokenizer's
vocabulary, 1 vision layer.
`prepare_model_for_flattening` gives its language model the packed backend and multimodal positions per sequence;
`VisionDataCollatorWithFlattening.from_model(model)` turns each batch into one row, images in example order;
`Trainer` keeps its default `remove_unused_columns=True` (a prepared model names every field the collator needs).
"""

import argparse
import os
import tempfile
from pathlib import Path

import datasets
import numpy as np
import PIL.Image
import torch
from transformers import (
    AutoModelForImageTextToText,
    AutoTokenizer,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
    Trainer,
    TrainingArguments,
)

from flatcollate import prepare_model_for_flattening
from flatcollate.data import make_supervised_dataset
from flatcollate.profiles import padded_fill
from flatcollate.testing.tiny_vision import tiny_vision_config, tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening, images_only, load_processor

DEFAULT_SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # what the chat template writes for each image part
WORDS = ["the", "a", "red", "blue", "square", "noise", "photo", "shows", "two", "dots", "bright", "dark", "why", "how"]
ROW_FEATURES = datasets.Features(
    {
        "messages": datasets.List(
            {
                "role": datasets.Value("string"),
                "content": datasets.List({"type": datasets.Value("string"), "text": datasets.Value("string")}),
            }
        ),
        "images": datasets.List(datasets.Image()),
    }
)

CHAT_TEMPLATE = (  # ChatML, one IMAGE per {"type": "image"} part
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '" + IMAGE + "' }}{%- else -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def qwen_processor(tokenizer_dir: Path) -> Qwen2_5_VLProcessor:
    """Qwen2.5-VL's processor (14-pixel patches, 2 x 2 merge) with the Qwen2.5 tokenizer, without its video slot;
    images of at most 112 x 112 pixels, so each becomes at most 16 placeholder tokens."""
    return images_only(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 112 * 112}),
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
        chat_template=CHAT_TEMPLATE,
    )


def model_for(processor, *, seed: int):
    """A tiny Qwen2.5-VL built from a config over the processor's vocabulary, special tokens and patch size."""
    config = tiny_vision_config("qwen2_5_vl")
    tokenizer = processor.tokenizer
    config.text_config.vocab_size = len(tokenizer)
    for name, token in (
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ):
        setattr(config, name, tokenizer.convert_tokens_to_ids(token))
    config.text_config.pad_token_id = tokenizer.pad_token_id
    config.vision_config.patch_size = processor.image_processor.patch_size
    config.vision_config.window_size = 112  # windows of 4 x 4 patches, as Qwen2.5-VL's 112 pixels
    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_config(config, dtype=torch.float32)


def conversation_rows(count: int, *, seed: int) -> datasets.Dataset:
    """`count` one-exchange conversations: a question with 0-2 generated images (random sizes, 28-140 pixels a side)
    and a short answer."""
    rng = np.random.default_rng(seed)
    text = lambda: " ".join(rng.choice(WORDS, rng.integers(2, 7)))  # noqa: E731
    rows = []
    for _ in range(count):  # one row at a time: each draws its own images
        images = [
            PIL.Image.fromarray(rng.integers(0, 256, (*rng.integers(28, 141, 2), 3), dtype=np.uint8))
            for _ in range(rng.integers(0, 3))
        ]
        question = [{"type": "image", "text": None}] * len(images) + [{"type": "text", "text": text() + "?"}]
        answer = [{"type": "text", "text": text() + "."}]
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages, "images": images})
    return datasets.Dataset.from_list(rows, features=ROW_FEATURES)


def encoded_rows(count: int, *, seed: int, cache_dir: str, processor_dir: str | None = None):
    """(model, encoded dataset, where the rows came from): the processor's encoding (the one in `processor_dir`, else
    the one built from the Qwen2.5 tokenizer when it is there), else `tiny_vision_examples` on
    `tiny_vision_lm("qwen2_5_vl")`."""
    tokenizer_dir = Path(os.environ.get("FLATCOLLATE_SHARED_DATA", DEFAULT_SHARED)) / "tokenizers" / "qwen2.5-instruct"
    if processor_dir is not None or tokenizer_dir.is_dir():
        if processor_dir is not None:
            processor, built = load_processor(processor_dir), f"load_processor({processor_dir!r})"
            processor.chat_template = processor.chat_template or CHAT_TEMPLATE
        else:
            processor, built = qwen_processor(tokenizer_dir), "images_only(Qwen2_5_VLProcessor)"
        dataset = make_supervised_dataset(
            processor, conversation_rows(count, seed=seed), seed=seed, cache_dir=cache_dir
        )
        return (
            model_for(processor, seed=seed),
            dataset,
            f"conversations with images, encoded by {type(processor).__name__} from {built}",
        )
    model = tiny_vision_lm("qwen2_5_vl", seed=seed)
    examples = tiny_vision_examples(model, count=count, seed=seed)
    rows = [{key: value.tolist() for key, value in example.items()} for example in examples]
    source = f"synthetic encoded rows (tiny_vision_examples): no Qwen2.5 tokenizer at {tokenizer_dir}"
    return model, datasets.Dataset.from_list(rows), source


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-examples", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processor", default=None, help="a local model directory whose processor encodes the rows")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model, dataset, source = encoded_rows(
            args.num_examples, seed=args.seed, cache_dir=f"{tmp}/cache", processor_dir=args.processor
        )
        print(f"data: {source}")
        dataset = dataset.with_format("torch")  # float32 pixels and int64 ids, as the processor returns them
        prepare_model_for_flattening(model)
        collator = VisionDataCollatorWithFlattening.from_model(model)
        lengths, rows = [], []

        def collate(features):  # records each batch's sequence lengths, to report what padding would have cost
            batch = collator(features)
            lengths.extend(torch.diff(batch["cu_seq_lens_q"]).tolist())
            rows.append(batch["input_ids"].shape[1])
            return batch

        training_args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.batch_size,
            num_train_epochs=1,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset, data_collator=collate)
        trainer.train()
    result = {
        "data": "processor" if "encoded by" in source else "synthetic",
        "optimizer_steps": trainer.state.global_step,
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "padding_efficiency": {
            "flattened": sum(lengths) / sum(rows),
            "padded": padded_fill(lengths, batch_size=args.batch_size),
        },
    }
    efficiency = result["padding_efficiency"]
    print("losses: " + ", ".join(f"{loss:.4f}" for loss in result["losses"]))
    print(
        f"padding efficiency (real tokens / tokens computed): flattened {efficiency['flattened']:.1%}, padded "
        f"batches of the same examples {efficiency['padded']:.1%}"
    )
    print(f"optimizer steps: {result['optimizer_steps']} ({len(dataset)} examples, batches of {args.batch_size})")
    return result


if __name__ == "__main__":
    main()
