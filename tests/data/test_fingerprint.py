"""Cache keys: a cached tokenized dataset is read back only where a fresh encoding gives the same rows.

Each case changes one thing a cache key must cover (a tokenizer setting, the content of an image file at the same
path), then checks the dataset `make_supervised_dataset` returns from a warm cache against a fresh encoding.
"""

import copy
import subprocess
import sys

import datasets
import PIL.Image
import pytest
from tokenizers import normalizers, pre_tokenizers
from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

from flatcollate.data import build_encoder, make_supervised_dataset
from flatcollate.data.fingerprint import tokenizer_fingerprint

from .test_vision_encode import ImageOnlyQwen2VLProcessor, chat_template, qwen_tokenizer

ROWS = [
    {"question": "Is <|endoftext|> one token?", "answer": "Only while special tokens are not split."},
    {"question": "Natalia sold clips to 48 of her friends.", "answer": "She sold 48 clips. Natalia is done."},
]
OPTIONS = {"query_field": "question", "resp_field": "answer"}

TOKENIZER_CHANGES = {
    "split_special_tokens": lambda t: setattr(t, "split_special_tokens", True),
    "add_bos_token": lambda t: setattr(t, "add_bos_token", True),
    "added_token": lambda t: t.add_tokens(["Natalia"]),
    "eos_token": lambda t: setattr(t, "eos_token", "!"),
    "normalizer": lambda t: setattr(t.backend_tokenizer, "normalizer", normalizers.Lowercase()),
    "pre_tokenizer": lambda t: setattr(
        t.backend_tokenizer, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)
    ),
}


@pytest.fixture(scope="module")
def gpt2(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))


def fresh(tokenizer, rows):
    encoder = build_encoder(tokenizer, **OPTIONS)
    return [encoder(row, index=i)["input_ids"] for i, row in enumerate(rows)]


@pytest.mark.parametrize("change", list(TOKENIZER_CHANGES))
def test_a_tokenizer_setting_that_changes_the_ids_changes_the_cache_key(gpt2, change, tmp_path):
    rows = datasets.Dataset.from_list(ROWS)
    cached = make_supervised_dataset(gpt2, rows, seed=None, cache_dir=tmp_path, **OPTIONS)
    assert cached["input_ids"] == fresh(gpt2, ROWS)
    changed = copy.deepcopy(gpt2)
    TOKENIZER_CHANGES[change](changed)
    expected = fresh(changed, ROWS)
    assert expected != cached["input_ids"], f"{change} should change the encoding of these rows"
    again = make_supervised_dataset(changed, rows, seed=None, cache_dir=tmp_path, **OPTIONS)
    assert again["input_ids"] == expected, f"the cache returned rows encoded before {change}"


@pytest.mark.slow
def test_the_tokenizer_key_is_the_same_for_the_same_tokenizer_in_another_process(gpt2, tokenizer_dir):
    path = tokenizer_dir("gpt2")
    assert tokenizer_fingerprint(gpt2) == tokenizer_fingerprint(copy.deepcopy(gpt2))
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(path)) == tokenizer_fingerprint(gpt2)
    script = (
        "import sys; from transformers import AutoTokenizer; from flatcollate.data.fingerprint import "
        "tokenizer_fingerprint; print(tokenizer_fingerprint(AutoTokenizer.from_pretrained(sys.argv[1])))"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == tokenizer_fingerprint(gpt2), "a cache written by one run is found by the next"


@pytest.fixture(scope="module")
def qwen2_vl(tokenizer_dir):
    return ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=4 * 56 * 56),
        tokenizer=qwen_tokenizer(tokenizer_dir),
        chat_template=chat_template("<|vision_start|><|image_pad|><|vision_end|>"),
    )


def image_rows(path, form):
    """One conversation whose image is the file at `path`, in the column forms that refer to a file by its path."""
    image = {"str": str(path), "image_dict": {"bytes": None, "path": str(path)}, "image_feature": str(path)}[form]
    messages = [
        {"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A square."}]},
    ]
    rows = [{"messages": messages, "images": [image]}]
    if form == "image_feature":  # `datasets.Image()` keeps a path, not the bytes, for a file given by its path
        features = datasets.Dataset.from_list(rows).features.copy()
        features["images"] = datasets.List(datasets.Image())
        return datasets.Dataset.from_list(rows, features=features), rows
    return datasets.Dataset.from_list(rows), rows


@pytest.mark.parametrize("form", ["str", "image_dict", "image_feature"])
def test_a_replaced_image_file_at_the_same_path_is_encoded_again(qwen2_vl, form, tmp_path):
    path = tmp_path / "square.png"
    PIL.Image.new("RGB", (56, 56), (200, 30, 30)).save(path)
    dataset, rows = image_rows(path, form)
    cache = tmp_path / "cache"
    first = make_supervised_dataset(qwen2_vl, dataset, seed=None, cache_dir=cache)
    PIL.Image.new("RGB", (112, 112), (30, 30, 200)).save(path)  # same path, another size and content
    expected = build_encoder(qwen2_vl)(dataset[0], index=0)
    assert len(expected["input_ids"]) != len(first[0]["input_ids"])
    again = make_supervised_dataset(qwen2_vl, dataset, seed=None, cache_dir=cache)
    assert again[0]["input_ids"] == expected["input_ids"], "the cache returned the old image's tokens"
    assert again[0]["image_grid_thw"] == expected["image_grid_thw"].tolist()
    unchanged = make_supervised_dataset(qwen2_vl, dataset, seed=None, cache_dir=cache)
    assert unchanged.cache_files == again.cache_files, "the same file content reads the cache back"
    assert rows[0]["images"]  # the rows themselves never changed: only the file did


def test_an_image_processor_of_another_class_with_the_same_settings_changes_the_cache_key(qwen2_vl):
    """transformers' PIL and torchvision image processors save the same settings under one type name and give
    different pixel values; the key holds the image processor's class (here a stand-in with the saved settings of
    the PIL one)."""
    from flatcollate.data.fingerprint import encoder_fingerprint

    class SameSettings(Qwen2VLImageProcessorPil):
        def to_dict(self):
            return {**super().to_dict(), "image_processor_type": "Qwen2VLImageProcessor"}

    other = copy.copy(qwen2_vl)
    other.image_processor = SameSettings(**qwen2_vl.image_processor.to_dict())
    other.image_processor.image_processor_type = "Qwen2VLImageProcessor"
    assert other.to_json_string() == qwen2_vl.to_json_string()  # the settings alone cannot tell them apart
    assert encoder_fingerprint(build_encoder(other)) != encoder_fingerprint(build_encoder(qwen2_vl))
