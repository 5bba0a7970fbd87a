"""Image-text processors from local files: `images_only` and `load_processor` encode as transformers' own processor
would, with and without torchvision.

The local files are laid out as a Qwen2.5-VL snapshot on the Hub lays them out (`preprocessor_config.json` naming
`Qwen2_5_VLProcessor`, the tokenizer's files, `chat_template.json`), with the Qwen2.5 tokenizer of the shared data.
The reference for an encoding is the image processor and the tokenizer called separately: each image's placeholder
repeated `t * h * w / merge**2` times, then tokenized. Tests needing torchvision skip without it
(`pip install "flatcollate[vision]"`); those pinning transformers' behaviour without it skip with it.
"""

import copy
import importlib.util
import json
import pickle
import shutil

import numpy as np
import PIL.Image
import pytest
import torch
from transformers import (
    AutoProcessor,
    AutoTokenizer,
    LlavaProcessor,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    Qwen3VLProcessor,
    Wav2Vec2Processor,
)

from flatcollate.data import build_encoder
from flatcollate.vision import images_only, load_processor
from flatcollate.vision.processors import HAS_TORCHVISION, holds_video_processor, processor_class_of

TORCHVISION = importlib.util.find_spec("torchvision") is not None
needs_torchvision = pytest.mark.skipif(not TORCHVISION, reason="needs torchvision: pip install 'flatcollate[vision]'")
without_torchvision = pytest.mark.skipif(TORCHVISION, reason="pins what transformers does without torchvision")

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SIZES = [(56, 84), (100, 37), (140, 140), (28, 28)]  # (height, width)
CHAT_TEMPLATE = (  # ChatML, one IMAGE per {"type": "image"} part
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '" + IMAGE + "' }}{%- else -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
)
PREPROCESSOR = {  # Qwen/Qwen2.5-VL-3B-Instruct's preprocessor_config.json
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


def write_snapshot(directory, tokenizer_path, *, preprocessor=PREPROCESSOR, config=None):
    """A model directory's processor files as the Hub holds them: tokenizer, image processor and chat template."""
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_path / name, directory / name)
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def qwen_tokenizer_path(tokenizer_dir):
    return tokenizer_dir("qwen2.5-instruct")


@pytest.fixture(scope="module")
def snapshot(qwen_tokenizer_path, tmp_path_factory):
    return write_snapshot(tmp_path_factory.mktemp("models") / "qwen2.5-vl", qwen_tokenizer_path)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [PIL.Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for size in SIZES]


@pytest.fixture(scope="module")
def image_only_processor(qwen_tokenizer_path):
    return images_only(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 112 * 112}),
        tokenizer=AutoTokenizer.from_pretrained(qwen_tokenizer_path),
        chat_template=CHAT_TEMPLATE,
    )


def encode(processor, images):
    """Two rows: all images then text; text, one image, text."""
    text = [IMAGE * len(images) + " What are they?", "Left " + IMAGE + " right."]
    return processor(text=text, images=[images, images[:1]], return_tensors="pt", padding=True)


def reference(image_processor, tokenizer, images) -> dict:
    """The same two rows encoded slowly: the image processor on each row's images, each placeholder repeated by its
    own grid, the expanded text tokenized."""
    ids, grids, pixels = [], [], []
    for row_images, text in (
        (images, IMAGE * len(images) + " What are they?"),
        (images[:1], "Left " + IMAGE + " right."),
    ):
        vision = image_processor(images=row_images, return_tensors="pt")
        for grid in vision["image_grid_thw"]:  # one placeholder per image, in order
            pads = int(grid.prod()) // image_processor.merge_size**2
            text = text.replace("<|image_pad|>", "<|placeholder|>" * pads, 1)
        ids.append(tokenizer(text.replace("<|placeholder|>", "<|image_pad|>"))["input_ids"])
        grids.append(vision["image_grid_thw"])
        pixels.append(vision["pixel_values"])
    return {"input_ids": ids, "image_grid_thw": torch.cat(grids), "pixel_values": torch.cat(pixels)}


def assert_encodes_as_reference(processor, images):
    out = encode(processor, images)
    expected = reference(processor.image_processor, processor.tokenizer, images)
    assert {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"} == set(out)
    for row, ids in enumerate(expected["input_ids"]):
        assert out["input_ids"][row][out["attention_mask"][row].bool()].tolist() == ids, f"row {row}"
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    torch.testing.assert_close(out["mm_token_type_ids"], (out["input_ids"] == image_pad).long() * out["attention_mask"])
    torch.testing.assert_close(out["image_grid_thw"], expected["image_grid_thw"])
    torch.testing.assert_close(out["pixel_values"], expected["pixel_values"], rtol=0, atol=0)


RESAMPLING = 0.05
"""Largest pixel-value gap between Qwen2-VL's PIL and torchvision image processors on the same image (measured 0.015
on these images, normalized units): resampling rounding; ids and grids are equal."""


def assert_encodings_agree(out, expected, *, across_backends: bool = False):
    """Every output equal; pixel values within `RESAMPLING` where one image processor is PIL, the other torchvision."""
    assert set(out) == set(expected)
    for key, value in expected.items():
        if key == "pixel_values" and across_backends:
            gap = (out[key] - value).abs()
            assert gap.max() <= RESAMPLING and gap.mean() < 1e-3, (gap.max(), gap.mean())
        else:
            torch.testing.assert_close(out[key], value, rtol=0, atol=0, msg=key)


# ---- what transformers does without torchvision ---------------------------------------------------------------


@without_torchvision
def test_without_torchvision_transformers_builds_no_qwen2_5_vl_processor(snapshot, qwen_tokenizer_path):
    with pytest.raises(ImportError, match="Qwen2VLVideoProcessor requires the Torchvision library"):
        AutoProcessor.from_pretrained(snapshot)
    with pytest.raises(AttributeError, match=r"VIDEO_PROCESSOR_MAPPING.*_extra_content"):
        Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessorPil(),
            tokenizer=AutoTokenizer.from_pretrained(qwen_tokenizer_path),
            video_processor=None,
        )


def test_the_torchvision_check_is_transformers_own():
    assert TORCHVISION == HAS_TORCHVISION


# ---- images_only ------------------------------------------------------------------------------------------------


def test_images_only_is_the_family_class_without_its_video_slot():
    cls = images_only(Qwen2_5_VLProcessor)
    assert cls is images_only(Qwen2_5_VLProcessor)  # one class: instances compare, pickle and cache alike
    assert cls.__name__ == "Qwen2_5_VLProcessor" and issubclass(cls, Qwen2_5_VLProcessor)
    assert cls.get_attributes() == ["image_processor", "tokenizer"]
    assert Qwen2_5_VLProcessor.get_attributes() == ["image_processor", "tokenizer", "video_processor"]
    assert images_only(LlavaProcessor) is LlavaProcessor  # nothing to drop


@pytest.mark.parametrize("value", [Qwen2VLImageProcessorPil, "Qwen2_5_VLProcessor", int])
def test_images_only_refuses_what_is_not_a_processor_class(value):
    with pytest.raises(TypeError, match=r"images_only takes a transformers processor class .*got"):
        images_only(value)


def test_images_only_refuses_a_processor_without_images():
    with pytest.raises(ValueError, match=r"Wav2Vec2Processor has no image processor \(its parts: feature_extractor"):
        images_only(Wav2Vec2Processor)


@pytest.mark.parametrize(("processor_class", "patch"), [(Qwen2VLProcessor, 14), (Qwen3VLProcessor, 16)])
def test_images_only_encodes_each_image_into_its_grid_of_placeholders(
    image_only_processor, images, processor_class, patch
):
    assert_encodes_as_reference(image_only_processor, images)  # Qwen2.5-VL
    processor = images_only(processor_class)(
        image_processor=Qwen2VLImageProcessorPil(patch_size=patch), tokenizer=image_only_processor.tokenizer
    )
    assert_encodes_as_reference(processor, images)


def test_images_only_drops_the_video_slot_of_every_image_text_processor():
    """Every processor class of transformers' image-text-to-text families: the video slot goes, the rest stays."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    names = {PROCESSOR_MAPPING_NAMES.get(model_type) for model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}
    classes = [getattr(transformers, name) for name in sorted(names - {None}) if hasattr(transformers, name)]
    with_video = [c for c in classes if not getattr(c, "is_dummy", False) and "video_processor" in c.get_attributes()]
    assert Qwen2_5_VLProcessor in with_video and LlavaProcessor in classes and LlavaProcessor not in with_video
    for cls in classes:
        if getattr(cls, "is_dummy", False) or "image_processor" not in cls.get_attributes():
            continue  # transformers' stand-in for a class that needs torchvision; or not an image processor
        expected = [name for name in cls.get_attributes() if name != "video_processor"]
        assert images_only(cls).get_attributes() == expected, cls.__name__
        assert (images_only(cls) is cls) == (cls not in with_video), cls.__name__


@without_torchvision
def test_images_only_names_torchvision_where_transformers_has_no_class_without_it():
    from transformers import PixtralProcessor  # Mistral 3's: a stand-in that raises on use without torchvision

    with pytest.raises(
        ImportError, match=r"PixtralProcessor only with torchvision.*pip install 'flatcollate\[vision\]'"
    ):
        images_only(PixtralProcessor)


def test_images_only_refuses_videos(image_only_processor):
    video = np.zeros((2, 28, 28, 3), dtype=np.uint8)
    for call in (
        lambda: image_only_processor(text=["<|vision_start|><|video_pad|><|vision_end|>"], videos=[video]),
        lambda: image_only_processor(None, ["<|vision_start|><|video_pad|><|vision_end|>"], [video]),
    ):
        with pytest.raises(ValueError, match=r"built without its video processor.*pip install 'flatcollate\[vision\]'"):
            call()


def test_images_only_processors_and_their_encoders_pickle(image_only_processor, images):
    again = pickle.loads(pickle.dumps(image_only_processor))
    assert type(again) is images_only(Qwen2_5_VLProcessor) and type(copy.deepcopy(again)) is type(again)
    assert_encodings_agree(encode(again, images), encode(image_only_processor, images))
    encoder = pickle.loads(pickle.dumps(build_encoder(image_only_processor, format="messages")))
    row = {
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Noise."}]},
        ],
        "images": images[:1],
    }
    assert encoder(row)["image_grid_thw"].tolist() == [[1, 4, 6]]


@needs_torchvision
def test_images_only_encodes_as_transformers_full_processor(image_only_processor, images):
    """With torchvision, the same parts plus Qwen2.5-VL's video processor: every output equal."""
    from transformers import Qwen2VLVideoProcessor

    full = Qwen2_5_VLProcessor(
        image_processor=image_only_processor.image_processor,
        tokenizer=image_only_processor.tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
    )
    assert_encodings_agree(encode(image_only_processor, images), encode(full, images))


# ---- load_processor ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Passing `min_pixels` and `max_pixels`:FutureWarning")  # transformers' own
def test_load_processor_reads_a_model_snapshot(snapshot, images):
    processor = load_processor(snapshot, min_pixels=28 * 28, max_pixels=112 * 112)  # the keys the snapshot's file has
    if TORCHVISION:
        assert type(processor) is Qwen2_5_VLProcessor and processor.video_processor is not None
    else:
        assert type(processor) is images_only(Qwen2_5_VLProcessor)
    assert processor.image_processor.size["longest_edge"] == 112 * 112  # keyword arguments reach the parts
    assert processor.chat_template == CHAT_TEMPLATE
    assert_encodes_as_reference(processor, images)


@needs_torchvision
def test_load_processor_is_auto_processor_where_torchvision_is(snapshot, images):
    assert_encodings_agree(
        encode(load_processor(snapshot), images), encode(AutoProcessor.from_pretrained(snapshot), images)
    )


@needs_torchvision
def test_the_pil_backend_encodes_as_the_torchvision_one_up_to_resampling(snapshot, images):
    """What a machine without torchvision encodes (the PIL image processor) against `AutoProcessor` with it: the same
    ids and grids; pixel values apart by resampling rounding only."""
    torchvision_backend = AutoProcessor.from_pretrained(snapshot)
    pil_backend = images_only(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(**PREPROCESSOR), tokenizer=torchvision_backend.tokenizer
    )
    expected, out = encode(torchvision_backend, images), encode(pil_backend, images)
    assert_encodings_agree(out, expected, across_backends=True)
    assert not torch.equal(out["pixel_values"], expected["pixel_values"])  # two backends indeed


def test_load_processor_reads_back_what_an_images_only_processor_saved(image_only_processor, images, tmp_path):
    image_only_processor.save_pretrained(tmp_path)
    assert not holds_video_processor(tmp_path)  # so even with torchvision, AutoProcessor would refuse it
    again = load_processor(tmp_path)
    assert type(again) is images_only(Qwen2_5_VLProcessor)
    assert again.to_dict() == image_only_processor.to_dict()
    # with torchvision, transformers reads the image processor back as its torchvision backend
    expected = encode(image_only_processor, images)
    assert_encodings_agree(encode(again, images), expected, across_backends=TORCHVISION)


def test_the_processor_class_falls_back_to_the_config_model_type(qwen_tokenizer_path, tmp_path):
    preprocessor = {key: value for key, value in PREPROCESSOR.items() if key != "processor_class"}
    directory = write_snapshot(tmp_path / "model", qwen_tokenizer_path, preprocessor=preprocessor, config={})
    with pytest.raises(ValueError, match=r"No processor class named in .*model_type \(None\)"):
        processor_class_of(directory)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    assert processor_class_of(directory) is Qwen2_5_VLProcessor


def test_load_processor_refuses_what_is_not_a_local_directory(tmp_path):
    with pytest.raises(
        ValueError, match=r"reads a local directory; 'Qwen/Qwen2.5-VL-3B-Instruct' is not one.*download"
    ):
        load_processor("Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(ValueError, match=r"No processor class named in"):
        load_processor(tmp_path)


def test_load_processor_names_a_processor_class_transformers_lacks(qwen_tokenizer_path, tmp_path):
    preprocessor = {**PREPROCESSOR, "processor_class": "MyOwnProcessor"}
    directory = write_snapshot(tmp_path / "model", qwen_tokenizer_path, preprocessor=preprocessor)
    with pytest.raises(ValueError, match=r"names the processor class 'MyOwnProcessor', which transformers .* not have"):
        processor_class_of(directory)
