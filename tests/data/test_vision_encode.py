"""Conversations with images through a processor: ids equal the processor's own, labels equal slow references.

Processors are built offline from the Qwen2.5 tokenizer: Qwen2-VL (a placeholder per merged patch, so the count
depends on the image size), LLaVA (a fixed count) and Gemma 3 (a fixed count inside text the processor adds), each with
a small chat template written here. References: rendering each reply's prefix conversation through the processor and
diffing token counts, and the processor's own `{% generation %}` mask.
"""

import pickle

import datasets
import numpy as np
import PIL.Image
import pytest
import torch
from transformers import (
    AutoTokenizer,
    CLIPImageProcessorPil,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    GotOcr2ImageProcessorPil,
    InternVLProcessor,
    LlavaProcessor,
    PaliGemmaProcessor,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    SiglipImageProcessorPil,
)

from flatcollate.data import RowError, SkippedRow, build_encoder, make_supervised_dataset
from flatcollate.data.vision_encode import TOKEN_FIELDS, VisionEncoder
from flatcollate.vision import images_only
from flatcollate.vision.collate import VisionDataCollatorWithFlattening
from flatcollate.vision.layouts import VisionLayout

SIZES = [(56, 56), (28, 84), (84, 28), (60, 45), (112, 56), (30, 30)]  # (height, width)
WORDS = ["the", "a", "cat", "sat", "on", "mat", "red", "blue", "big", "why", "how", "photo", "shows", "two", "dogs"]


def chat_template(placeholder: str, *, generation: bool = False) -> str:
    """A ChatML template writing `placeholder` for each image part; with `generation`, replies are marked."""
    content = (
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}{{ '" + placeholder + "' }}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
    )
    start, end = ("{%- generation -%}", "{%- endgeneration -%}") if generation else ("", "")
    return (
        "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['role'] == 'assistant' -%}"
        + start
        + content
        + "{{ '<|im_end|>\\n' }}"
        + end
        + "{%- else -%}"
        + content
        + "{{ '<|im_end|>\\n' }}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor without its video slot (whose processor class needs torchvision)."""

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]


def qwen_tokenizer(tokenizer_dir, **kwargs):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"), **kwargs)


@pytest.fixture(scope="module")
def processors(tokenizer_dir):
    qwen = ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=2 * 56 * 56),
        tokenizer=qwen_tokenizer(tokenizer_dir),
        chat_template=chat_template("<|vision_start|><|image_pad|><|vision_end|>"),
    )
    llava_tokenizer = qwen_tokenizer(tokenizer_dir)
    llava_tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    llava = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=llava_tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=chat_template("<image>"),
    )
    gemma_tokens = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    gemma = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 28, "width": 28}),
        tokenizer=qwen_tokenizer(tokenizer_dir, extra_special_tokens=gemma_tokens),
        image_seq_length=5,
        chat_template=chat_template("<start_of_image>"),
    )
    intern_tokens = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>"}
    internvl = images_only(InternVLProcessor)(
        image_processor=GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=False),
        tokenizer=qwen_tokenizer(tokenizer_dir, extra_special_tokens={**intern_tokens, "video_token": "<video>"}),
        image_seq_length=4,
        chat_template=chat_template("<IMG_CONTEXT>"),
    )
    siglip = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    siglip.image_seq_length = 4
    paligemma = PaliGemmaProcessor(  # inserts BOS after the last image and a newline at the end of the text
        image_processor=siglip,
        tokenizer=qwen_tokenizer(
            tokenizer_dir, bos_token="<|endoftext|>", extra_special_tokens={"image_token": "<image>"}
        ),
        chat_template=chat_template("<image>"),
    )
    return {"qwen2_vl": qwen, "llava": llava, "gemma3": gemma, "internvl": internvl, "paligemma": paligemma}


def random_image(rng, size, mode="RGB"):
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels).convert(mode)


def random_row(rng, *, as_parts=True):
    """A conversation of 1-3 exchanges; each user turn has 0-2 images around its text; sometimes a system turn."""
    text = lambda: " ".join(rng.choice(WORDS, rng.integers(1, 6)))  # noqa: E731
    system = [{"type": "text", "text": "Describe images."}] if as_parts else "Describe images."
    messages = [{"role": "system", "content": system}] if rng.random() < 0.3 else []
    images = []
    for _ in range(rng.integers(1, 4)):
        parts = [{"type": "text", "text": text().capitalize() + "?"}]
        for _ in range(rng.integers(0, 3)):
            parts.insert(int(rng.integers(0, len(parts) + 1)), {"type": "image"})
            images.append(random_image(rng, SIZES[rng.integers(len(SIZES))]))
        reply = text().capitalize() + "."
        messages.append({"role": "user", "content": parts})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}] if as_parts else reply})
    return {"messages": messages, "images": images}


def processor_ids(processor, text, images):
    return processor(text=[text], images=[images] if images else None)["input_ids"][0]


def prefix_reference(processor, messages, images):
    """Slow reference: a reply's tokens lie between the processed conversation before it (with the generation
    prompt) and the conversation through it; each prefix is rendered and processed on its own."""
    full = processor_ids(processor, processor.apply_chat_template(messages), images)
    labels, used = [-100] * len(full), 0
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            parts = [] if isinstance(message["content"], str) else message["content"]
            used += [part["type"] for part in parts].count("image")
            continue
        before = processor_ids(
            processor, processor.apply_chat_template(messages[:k], add_generation_prompt=True), images[:used]
        )
        through = processor_ids(processor, processor.apply_chat_template(messages[: k + 1]), images[:used])
        assert list(full[: len(through)]) == list(through) and list(through[: len(before)]) == list(before)
        labels[len(before) : len(through)] = full[len(before) : len(through)]
    return labels


@pytest.mark.parametrize("family", ["qwen2_vl", "llava", "gemma3", "internvl"])
def test_ids_and_vision_fields_equal_the_processor(processors, family):
    processor = processors[family]
    encoder = build_encoder(processor, format="messages")
    rng = np.random.default_rng(0)
    for i in range(10):
        row = random_row(rng, as_parts=i % 2 == 0)
        out = encoder(row, index=i)
        text = processor.apply_chat_template(row["messages"])
        reference = processor(text=[text], images=[row["images"]] if row["images"] else None)
        assert set(out) == {k for k in reference if k != "attention_mask"} | {"labels"}
        assert out["input_ids"] == list(reference["input_ids"][0])
        for key in set(out) - {"input_ids", "labels"}:  # per-token fields come back 1-D, vision fields as they are
            expected = reference[key][0] if key in TOKEN_FIELDS else reference[key]
            np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(expected))


@pytest.mark.parametrize("family", ["qwen2_vl", "llava", "gemma3", "internvl"])
def test_labels_equal_the_prefix_reference(processors, family):
    processor = processors[family]
    encoder = build_encoder(processor, format="messages")
    rng = np.random.default_rng(1)
    for i in range(10):
        row = random_row(rng, as_parts=i % 2 == 1)
        assert encoder(row, index=i)["labels"] == prefix_reference(processor, row["messages"], row["images"])


def test_labels_equal_the_generation_mask(processors):
    processor = processors["qwen2_vl"]
    encoder = build_encoder(processor, format="messages")
    rng = np.random.default_rng(2)
    for i in range(10):
        row = random_row(rng)
        out = encoder(row, index=i)
        marked = processor.apply_chat_template(
            row["messages"],
            chat_template=chat_template("<|vision_start|><|image_pad|><|vision_end|>", generation=True),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            processor_kwargs={"images": row["images"]} if row["images"] else None,
        )
        assert out["input_ids"] == list(marked["input_ids"][0])
        assert out["labels"] == np.where(np.asarray(marked["assistant_masks"][0]) == 1, out["input_ids"], -100).tolist()


def test_every_placeholder_is_untrained_and_counted_by_the_grid(processors):
    processor = processors["qwen2_vl"]
    encoder = build_encoder(processor, format="messages")
    rng = np.random.default_rng(3)
    for i in range(10):
        out = encoder(random_row(rng), index=i)
        ids, labels = np.asarray(out["input_ids"]), np.asarray(out["labels"])
        pads = ids == processor.image_token_id
        grid = out.get("image_grid_thw", np.zeros((0, 3), dtype=np.int64))
        assert pads.sum() == (grid.prod(axis=1) // 4).sum()
        assert (labels[pads] == -100).all() and (np.asarray(out["mm_token_type_ids"]) == pads).all()


def test_paths_bytes_and_modes_equal_rgb_images(processors, tmp_path):
    rng = np.random.default_rng(4)
    encoder = build_encoder(processors["qwen2_vl"], format="messages")
    modes = ["RGB", "L", "RGBA", "P", "CMYK"]  # CMYK as JPEG, the others as PNG
    paths = [tmp_path / f"image{k}.{'jpg' if mode == 'CMYK' else 'png'}" for k, mode in enumerate(modes)]
    for path, size, mode in zip(paths, SIZES, modes, strict=False):
        random_image(rng, size, mode).save(path)
    as_given = [str, lambda p: p, lambda p: {"bytes": p.read_bytes(), "path": None}, lambda p: {"path": str(p)}]
    sources = [as_given[k % 4](path) for k, path in enumerate(paths)]
    loaded = [PIL.Image.open(path).convert("RGB") for path in paths]
    parts = [{"type": "image"}] * len(paths) + [{"type": "text", "text": "What are these?"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": "Five squares."}]
    from_files = encoder({"messages": messages, "images": sources}, index=0)
    from_pil = encoder({"messages": messages, "images": loaded}, index=0)
    assert from_files["input_ids"] == from_pil["input_ids"] and from_files["labels"] == from_pil["labels"]
    np.testing.assert_array_equal(from_files["pixel_values"], from_pil["pixel_values"])


def one_image_row(image):
    parts = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    return {
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "A cat."}],
        "images": [image],
    }


def test_none_valued_keys_of_messages_and_parts_are_absent(processors):
    """`Dataset.from_list` gives every message every key and every content part every key, None where it has none.
    Qwen2-VL's template takes a part with an `image` key for an image, so a text part stored with `image: None`
    would be written as one: the stored row encodes as the row written with its own keys only."""
    processor = processors["qwen2_vl"]
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    qwen2_vl_test = "part['type'] == 'image' or 'image' in part"
    template = chat_template(placeholder).replace("part['type'] == 'image'", qwen2_vl_test)
    string = datasets.Value("string")
    part = {"type": string, "text": string, "image": string}
    features = datasets.Features(
        {
            "messages": datasets.List({"role": string, "content": datasets.List(part), "name": string}),
            "images": datasets.List(datasets.Image()),
        }
    )
    written = one_image_row(PIL.Image.new("RGB", (56, 56)))
    written["messages"][1]["content"] = [{"type": "text", "text": "A cat."}]
    row = datasets.Dataset.from_list([written], features=features)[0]
    assert row["messages"][0]["content"][1] == {"type": "text", "text": "What is it?", "image": None}
    encoder = build_encoder(processor, format="messages", chat_template=template)
    out, expected = encoder(row, index=0), encoder(written, index=0)
    assert out["input_ids"] == expected["input_ids"] and out["labels"] == expected["labels"]
    np.testing.assert_array_equal(out["pixel_values"], expected["pixel_values"])
    # The control: rendered as stored, every part (each has an `image` key) is written as an image.
    assert processor.apply_chat_template(row["messages"], chat_template=template).count("<|image_pad|>") == 3


def bad_rows(tmp_path):
    """(row, reason, words the message must hold) for each way a row with images can be wrong."""
    image = PIL.Image.new("RGB", (56, 56))
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not pixels")
    extra_part = one_image_row(image)
    extra_part["messages"][0]["content"].append({"type": "image"})
    in_reply = one_image_row(image)
    in_reply["messages"][1]["content"] = [{"type": "image"}, {"type": "text", "text": "A cat."}]
    video = one_image_row(image)
    video["messages"][0]["content"][0] = {"type": "video", "video": np.zeros((2, 28, 28, 3), np.uint8)}
    video["images"] = []
    in_reply_video = {**video, "messages": [video["messages"][0], {**in_reply["messages"][1]}]}
    in_reply_video["messages"][1]["content"] = [{"type": "video"}, {"type": "text", "text": "A cat."}]
    return [
        (extra_part, "image_count", ["2 {'type': 'image'} parts", "1 images in field 'images'"]),
        ({**one_image_row(image), "images": [image, image]}, "image_count", ["but 2 images"]),
        ({**one_image_row(image), "images": None}, "image_count", ["but 0 images"]),
        (one_image_row(str(tmp_path / "missing.png")), "missing_image", ["image 0", "missing.png", "fix the path"]),
        (one_image_row(42), "bad_image", ["image 0 is a int", "datasets.Image()"]),
        (one_image_row(str(not_an_image)), "bad_image", ["image 0 cannot be read", "notes.png"]),
        (in_reply, "image_in_reply", ["message 1 (assistant), part 0", "move it into the user turn"]),
        (video, "no_video_processor", ["message", "without its video processor", "torchvision", "[vision]"]),
        (in_reply_video, "image_in_reply", ["message 1 (assistant), part 0: a video in a reply"]),
        (one_image_row(image) | {"videos": [np.zeros((2, 28, 28, 3), np.uint8)]}, "no_video_processor", ["video"]),
        (one_image_row(PIL.Image.new("RGB", (6000, 20))), "processor_error", ["the processor refused the row"]),
        ({"prompt": "q", "completion": "a", "images": [image]}, "unknown_format", ["field 'images' holds images"]),
    ]


def test_bad_rows_raise_naming_row_and_field_or_are_skipped(processors, tmp_path):
    raising = build_encoder(processors["qwen2_vl"])
    skipping = build_encoder(processors["qwen2_vl"], on_error="skip")
    for row, reason, words in bad_rows(tmp_path):
        with pytest.raises(RowError) as caught:
            raising(row, index=3)
        assert caught.value.reason == reason and "row 3" in str(caught.value), str(caught.value)
        assert all(w in str(caught.value) for w in words), str(caught.value)
        assert skipping(row, index=3) == SkippedRow(3, reason, str(caught.value))
    with pytest.raises(TypeError):  # a non-image object is also a TypeError, like other wrong types
        raising(one_image_row(42), index=0)


def test_templates_without_images_or_processors_without_templates_are_refused(processors):
    processor = processors["qwen2_vl"]
    drops_images = chat_template("")
    with pytest.raises(RowError, match="writes 0 image placeholders '<\\|image_pad\\|>' for 1 image parts") as caught:
        build_encoder(processor, chat_template=drops_images)(one_image_row(PIL.Image.new("RGB", (56, 56))), index=0)
    assert caught.value.reason == "template_drops_content"
    bare = ImageOnlyQwen2VLProcessor(image_processor=processor.image_processor, tokenizer=processor.tokenizer)
    with pytest.raises(ValueError, match="has no chat template; pass chat_template="):
        build_encoder(bare, format="messages")
    with pytest.raises(RowError, match="row 5 is a conversation but the processor has no chat template") as caught:
        build_encoder(bare)(one_image_row(PIL.Image.new("RGB", (56, 56))), index=5)
    assert caught.value.reason == "no_chat_template"
    with pytest.raises(TypeError, match="processor_kwargs= applies to a processor"):
        build_encoder(processor.tokenizer, processor_kwargs={"max_pixels": 10})


def test_processor_kwargs_reach_the_processor_and_the_encoder_pickles(processors):
    processor = processors["qwen2_vl"]
    row = one_image_row(PIL.Image.new("RGB", (112, 112)))
    big = build_encoder(processor, processor_kwargs={"size": {"shortest_edge": 28 * 28, "longest_edge": 112 * 112}})
    small = pickle.loads(pickle.dumps(build_encoder(processor)))
    assert isinstance(small, VisionEncoder)
    assert big(row)["image_grid_thw"].tolist() == [[1, 8, 8]] and small(row)["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_make_supervised_dataset_with_an_image_column(processors, tmp_path):
    processor = processors["qwen2_vl"]
    rng = np.random.default_rng(5)
    rows = [random_row(rng) for _ in range(6)]
    rows[2]["images"] = rows[2]["images"][:-1] if rows[2]["images"] else [PIL.Image.new("RGB", (56, 56))]  # bad
    text_only = [
        {"role": "user", "content": [{"type": "text", "text": "Hi?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
    ]
    rows[4] = {"messages": text_only, "images": []}
    features = datasets.Features(
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
    source = datasets.Dataset.from_list(rows, features=features)
    ds, stats = make_supervised_dataset(
        processor, source, seed=None, on_error="skip", cache_dir=tmp_path, return_stats=True
    )
    assert stats.skipped == {"image_count": 1} and stats.first_skipped == {"image_count": [2]}
    assert ds.column_names == ["input_ids", "labels", "mm_token_type_ids", "pixel_values", "image_grid_thw"]
    encoder = build_encoder(processor)
    kept = ds.with_format("torch")
    for k, i in enumerate([0, 1, 3, 4, 5]):
        expected = encoder(source[i], index=i)
        got = kept[k]
        assert got["input_ids"].tolist() == expected["input_ids"] and got["labels"].tolist() == expected["labels"]
        if "pixel_values" not in expected:
            assert got["pixel_values"] is None and got["image_grid_thw"] is None
            continue
        assert got["pixel_values"].dtype == torch.float32 and got["image_grid_thw"].dtype == torch.int64
        torch.testing.assert_close(got["pixel_values"], torch.from_numpy(expected["pixel_values"]), rtol=0, atol=0)
        torch.testing.assert_close(got["image_grid_thw"], torch.from_numpy(expected["image_grid_thw"]))
    again = make_supervised_dataset(processor, source, seed=None, on_error="skip", cache_dir=tmp_path)
    assert again.cache_files == ds.cache_files  # same processor and options: the cached file is read back


def test_rows_feed_the_flattening_collator(processors):
    processor = processors["qwen2_vl"]
    rng = np.random.default_rng(6)
    rows = [random_row(rng) for _ in range(4)]
    encoded = [build_encoder(processor)(row, index=i) for i, row in enumerate(rows)]
    layout = VisionLayout(image_token_id=processor.image_token_id, merge_size=processor.image_processor.merge_size)
    batch = VisionDataCollatorWithFlattening(layout=layout)(encoded)  # checks each row's placeholders by its grid
    assert batch["input_ids"][0].tolist() == [t for row in encoded for t in row["input_ids"]]
    with_images = [row for row in encoded if "pixel_values" in row]
    for key in ("pixel_values", "image_grid_thw"):
        expected = torch.from_numpy(np.concatenate([row[key] for row in with_images]))
        torch.testing.assert_close(batch[key], expected, rtol=0, atol=0)


def text_rows(count):
    """Text-only conversations (parts, no images), as an image-text dataset holds beside its image rows."""
    return [
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": f"Question {k}?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": f"Answer {k}."}]},
            ],
            "images": [],
        }
        for k in range(count)
    ]


def test_internvl_text_rows_are_encoded_and_kept(processors, tmp_path):
    """InternVL's processor reports no replacement in a text row as an empty array (not a list): the row is encoded
    as the prefix reference says, and `on_error="skip"` keeps every text row."""
    processor = processors["internvl"]
    rows = text_rows(3)
    for i, row in enumerate(rows):
        assert build_encoder(processor)(row, index=i)["labels"] == prefix_reference(processor, row["messages"], [])
    source = datasets.Dataset.from_list(rows)
    ds, stats = make_supervised_dataset(
        processor, source, seed=None, on_error="skip", cache_dir=tmp_path, return_stats=True
    )
    assert stats.skipped == {} and len(ds) == 3


def reply_tokens_reference(tokenizer, ids, replies, suffix="<|im_end|>\n"):
    """Slow reference of the trained tokens: each token decoded on its own, characters counted along the row, and a
    token trained when it overlaps a reply written after an assistant header (reply then `suffix`)."""
    pieces = [tokenizer.decode([t]) for t in ids]
    text = "".join(pieces)
    assert tokenizer.decode(ids) == text  # byte-level tokens of ASCII text decode one by one
    trained, pos = np.zeros(len(ids), dtype=bool), 0
    for reply in replies:
        start = text.index("assistant\n" + reply + suffix, pos) + len("assistant\n")
        end = pos = start + len(reply + suffix)
        at = 0
        for k, piece in enumerate(pieces):
            trained[k] |= at < end and start < at + len(piece)
            at += len(piece)
    return trained


def test_paligemma_labels_are_the_replies_and_its_prefix_ends_at_the_first_reply(processors):
    """PaliGemma's processor returns its own `labels` (all -100 without `suffix=`) and `token_type_ids` all 0 (the
    whole row a bidirectional prefix), and inserts BOS after the last image: the encoder's labels are the replies'
    tokens of the processed row, and the prefix (type 0, attended both ways) ends where the first reply starts."""
    processor = processors["paligemma"]
    encoder = build_encoder(processor, format="messages")
    rng = np.random.default_rng(7)
    for i in range(6):
        row = random_row(rng)
        if not row["images"]:
            row["messages"][0]["content"].insert(0, {"type": "image"})
            row["images"].insert(0, random_image(rng, (28, 28)))
        out = encoder(row, index=i)
        text = processor.apply_chat_template(row["messages"])
        assert out["input_ids"] == list(processor_ids(processor, text, row["images"]))
        replies = [m["content"][0]["text"] for m in row["messages"] if m["role"] == "assistant"]
        trained = reply_tokens_reference(processor.tokenizer, out["input_ids"], replies)
        assert out["labels"] == np.where(trained, out["input_ids"], -100).tolist()
        shifted = np.roll(trained, -1)  # negative control: the reference tells a one-token shift apart
        assert out["labels"] != np.where(shifted, out["input_ids"], -100).tolist()
        first = int(np.argmax(trained))
        assert out["token_type_ids"] == [0] * first + [1] * (len(trained) - first)


def test_a_text_models_chat_template_is_refused_naming_it(processors, tokenizer_dir):
    """A text tokenizer's template (Qwen2.5's joins `message['content']` as a string) fails on content parts inside
    the template probe: a ValueError names the template and the fix instead of Jinja's TypeError; the image-text
    template of the same processor builds (the control)."""
    processor = processors["qwen2_vl"]
    text_template = qwen_tokenizer(tokenizer_dir).chat_template
    with pytest.raises(ValueError, match=r"^the chat_template passed cannot render .* list of parts .*chat_template="):
        build_encoder(processor, format="messages", chat_template=text_template)
    texts = ImageOnlyQwen2VLProcessor(
        image_processor=processor.image_processor, tokenizer=processor.tokenizer, chat_template=text_template
    )
    with pytest.raises(ValueError, match=r"^ImageOnlyQwen2VLProcessor.chat_template cannot render .*'<\\|image_pad"):
        build_encoder(texts, format="messages")
    assert isinstance(build_encoder(processor, format="messages"), VisionEncoder)
