"""Conversations with videos through the family's real processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), built offline from
the Qwen2.5 tokenizer of the shared data: the encoder's ids and video fields equal the processor's own call on the
rendered text, no video token is trained, the replies are.

transformers' video processors need torchvision (`pip install "flatcollate[vision]"`, the build made for the installed
torch); the tests that encode videos skip without it. Without it a row with a video is refused naming torchvision.
"""

import importlib.util

import datasets
import numpy as np
import PIL.Image
import pytest
from transformers import (
    AutoTokenizer,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    Qwen3VLProcessor,
)

from flatcollate.data import RowError, build_encoder, make_supervised_dataset
from flatcollate.vision import images_only

from ..data.test_vision_encode import processors  # noqa: F401 (a fixture)

TORCHVISION = importlib.util.find_spec("torchvision") is not None
needs_torchvision = pytest.mark.skipif(
    not TORCHVISION, reason="transformers' video processors need torchvision: pip install 'flatcollate[vision]'"
)

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
CHAT_TEMPLATE = (  # ChatML, IMAGE per {"type": "image"} part, VIDEO per {"type": "video"} part
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '" + IMAGE + "' }}"
    "{%- elif part['type'] == 'video' -%}{{ '" + VIDEO + "' }}"
    "{%- else -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
)
FAMILIES = {
    "qwen2_vl": (Qwen2VLProcessor, 14),
    "qwen2_5_vl": (Qwen2_5_VLProcessor, 14),
    "qwen3_vl": (Qwen3VLProcessor, 16),
}
"""model_type -> (processor class, patch size): Qwen3-VL's patches are 16 pixels."""


def video_processor_for(family: str, tokenizer):
    """The family's processor, video slot included: its own image and video processors, small frames."""
    from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    processor_class, patch = FAMILIES[family]
    side = 2 * patch  # one merged patch
    if family == "qwen3_vl":  # its limits bound all frames together; frames are taken as given (no fps sampling)
        videos = Qwen3VLVideoProcessor(
            size={"shortest_edge": side**2, "longest_edge": 64 * side**2}, do_sample_frames=False
        )
    else:
        videos = Qwen2VLVideoProcessor(size={"shortest_edge": side**2, "longest_edge": 16 * side**2})
    return processor_class(
        image_processor=Qwen2VLImageProcessorPil(
            patch_size=patch, size={"shortest_edge": side**2, "longest_edge": 16 * side**2}
        ),
        tokenizer=tokenizer,
        video_processor=videos,
        chat_template=CHAT_TEMPLATE,
    )


@pytest.fixture(scope="session")
def qwen_tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


def frames(seed: int, count: int = 4, size: tuple[int, int] = (56, 56)) -> np.ndarray:
    """`(count, height, width, 3)` uint8 random frames."""
    return np.random.default_rng(seed).integers(0, 256, (count, *size, 3), dtype=np.uint8)


def five_conversations(image: tuple[int, int], one: tuple, two: tuple, three: tuple) -> list[dict]:
    """The video proofs' examples: 0 and 3 hold videos of one shape (they can be swapped), 1 a video and an image of
    size `image`, 2 two videos, 4 text only. `one`, `two`, `three`: `(frames, (height, width))` of example 1's video
    and of example 2's two."""
    two_videos = video_row(frames(2, *two), question="And then?")
    two_videos["messages"][0]["content"].append({"type": "video", "video": frames(3, *three)})
    text = video_row(None)
    text["messages"][0]["content"].pop(0)
    return [
        video_row(frames(0)),
        video_row(frames(1, *one), image=PIL.Image.fromarray(frames(9, 1, image)[0]), reply="It rolls away."),
        two_videos,
        video_row(frames(4), reply="Nothing."),
        text,
    ]


def video_row(video, *, image=None, question: str = "What happens?", reply: str = "A cat jumps.") -> dict:
    """One exchange: a video (and an image) in the user turn, a text reply."""
    parts = [{"type": "video", "video": video}, {"type": "text", "text": question}]
    row = {"images": []}
    if image is not None:
        parts.insert(1, {"type": "image"})
        row["images"] = [image]
    row["messages"] = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": reply}]},
    ]
    return row


def rendered(row: dict) -> str:
    """The row as the template renders it: ChatML with a VIDEO (IMAGE) per part."""
    text = ""
    for message in row["messages"]:
        parts = [
            IMAGE if p["type"] == "image" else VIDEO if p["type"] == "video" else p["text"] for p in message["content"]
        ]
        text += f"<|im_start|>{message['role']}\n{''.join(parts)}<|im_end|>\n"
    return text


@needs_torchvision
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_video_row_encodes_as_the_processor_does(family, qwen_tokenizer):
    processor = video_processor_for(family, qwen_tokenizer)
    image = PIL.Image.fromarray(frames(9, 1, (56, 84))[0])
    row = video_row(frames(0), image=image)
    out = build_encoder(processor)(row)
    expected = processor(text=[rendered(row)], images=[[image]], videos=[frames(0)], return_tensors="np")
    assert out["input_ids"] == expected["input_ids"][0].tolist()
    assert out["mm_token_type_ids"] == expected["mm_token_type_ids"][0].tolist()
    video_fields = {"pixel_values_videos", "video_grid_thw"} | (
        {"second_per_grid_ts"} if family == "qwen2_5_vl" else set()
    )
    assert video_fields | {"pixel_values", "image_grid_thw"} == set(out) - {"input_ids", "labels", "mm_token_type_ids"}
    for key in video_fields | {"pixel_values", "image_grid_thw"}:
        np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(expected[key]), err_msg=key)
    ids, labels = np.array(out["input_ids"]), np.array(out["labels"])
    video_token = processor.video_token_id
    assert (ids == video_token).sum() == out["video_grid_thw"].prod() // 4  # every video token is there...
    assert (labels[ids == video_token] == -100).all()  # ...and none is trained
    assert qwen_tokenizer.decode(ids[labels != -100]) == "A cat jumps.<|im_end|>\n"  # the reply is, all of it


@needs_torchvision
def test_a_video_is_frames_in_any_of_their_forms(qwen_tokenizer):
    """An array, a list of PIL frames, nested lists (a `datasets` column read back) and a `videos` field encode alike;
    the negative control: other frames do not."""
    encoder = build_encoder(video_processor_for("qwen2_vl", qwen_tokenizer))
    expected = encoder(video_row(frames(0)))
    as_pil = [PIL.Image.fromarray(frame) for frame in frames(0)]
    column = video_row(None) | {"videos": [frames(0).tolist()]}
    column["messages"][0]["content"][0] = {"type": "video"}
    for row in (video_row(as_pil), video_row(frames(0).tolist()), column):
        np.testing.assert_array_equal(encoder(row)["pixel_values_videos"], expected["pixel_values_videos"])
    assert not np.array_equal(encoder(video_row(frames(1)))["pixel_values_videos"], expected["pixel_values_videos"])


@needs_torchvision
def test_make_supervised_dataset_keeps_the_video_fields(qwen_tokenizer):
    processor = video_processor_for("qwen2_5_vl", qwen_tokenizer)
    rows = [video_row(None) | {"videos": [frames(k).tolist()]} for k in range(2)]
    for row in rows:
        row["messages"][0]["content"][0] = {"type": "video"}
    text = video_row(None) | {"videos": []}
    text["messages"][0]["content"].pop(0)
    rows.append(text)
    ds = make_supervised_dataset(processor, datasets.Dataset.from_list(rows), seed=None).with_format("numpy")
    encoder = build_encoder(processor)
    for k in range(2):
        expected = encoder(rows[k])
        for key in ("input_ids", "labels", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
            np.testing.assert_allclose(np.asarray(ds[k][key]), np.asarray(expected[key]), rtol=1e-6, err_msg=key)
    assert ds[2]["pixel_values_videos"] is None and ds[2]["video_grid_thw"] is None  # text only: no video


def test_a_video_without_torchvision_is_refused_naming_it(qwen_tokenizer):
    """A processor without its video slot (`images_only`: what a machine without torchvision builds) refuses a row
    with a video, naming torchvision and the fix; the same row without the video encodes."""
    processor = images_only(Qwen2VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(), tokenizer=qwen_tokenizer, chat_template=CHAT_TEMPLATE
    )
    encoder = build_encoder(processor)
    with pytest.raises(
        RowError, match=r"row 3: field 'messages'.*video.*torchvision.*pip install 'flatcollate\[vision\]'"
    ):
        encoder(video_row(frames(0)), index=3)
    row = video_row(frames(0))
    row["messages"][0]["content"].pop(0)
    assert "pixel_values_videos" not in encoder(row)


def test_a_video_for_a_family_without_videos_is_refused(processors):  # noqa: F811
    """LLaVA's processor has no video slot: a row with a video is refused; without the video it encodes."""
    encoder = build_encoder(processors["llava"])
    with pytest.raises(RowError, match=r"row 1: field 'messages' holds a video but LlavaProcessor takes no videos"):
        encoder(video_row(frames(0)), index=1)
    row = video_row(None)
    row["messages"][0]["content"].pop(0)
    assert "input_ids" in encoder(row)


@needs_torchvision
@pytest.mark.parametrize(
    ("video", "match"),
    [
        ("clip.mp4", r"row 0: field 'messages', message 0, part 0: a video file path.*decode its frames"),
        (
            np.zeros((56, 56, 3), dtype=np.uint8),
            r"row 0: .*part 0: .*shape \(56, 56, 3\).*\(frames, height, width, 3\)",
        ),
        (
            [np.zeros((56, 56, 3), np.uint8), np.zeros((28, 56, 3), np.uint8)],
            r"row 0: .*frame 1 has shape \(28, 56, 3\) but frame 0",
        ),
        (None, r"row 0: 1 \{'type': 'video'\} parts .* but 0 videos in field 'videos'"),
    ],
)
def test_a_bad_video_is_refused_naming_the_row_field_and_fix(video, match, qwen_tokenizer):
    encoder = build_encoder(video_processor_for("qwen2_vl", qwen_tokenizer))
    row = video_row(video)
    if video is None:
        row["messages"][0]["content"][0] = {"type": "video"}
    with pytest.raises(RowError, match=match):
        encoder(row, index=0)
