"""`build_encoder` on TRL's dataset formats: conversational prompt/completion rows and `train_on_prompt`.

The trainer-level comparison with `FlatSFTTrainer` is `tests/integrations/test_flat_sft_streaming_labels.py`; here
the labels are read token by token.
"""

import pickle

import pytest
from transformers import AutoTokenizer

from flatcollate.data import RowError
from flatcollate.data.encoders import build_encoder

from .label_runs import trained_runs

CHAT = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "Red."},
]


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.mark.parametrize("format", ["prompt_completion", "auto"])
def test_conversational_prompt_completion_trains_the_completions_replies(qwen, format):
    encoder = pickle.loads(pickle.dumps(build_encoder(qwen, format=format)))
    out = encoder({"prompt": CHAT[:3], "completion": CHAT[3:]})
    assert out["input_ids"] == list(qwen.apply_chat_template(CHAT, tokenize=True)["input_ids"])
    assert [qwen.decode(run) for run in trained_runs(out["labels"])] == ["Red.<|im_end|>\n"]
    # The same conversation as a `messages` row trains both replies, with the same ids.
    both = build_encoder(qwen, format="messages")({"messages": CHAT})
    assert both["input_ids"] == out["input_ids"]
    assert [qwen.decode(run) for run in trained_runs(both["labels"])] == ["Blue.<|im_end|>\n", "Red.<|im_end|>\n"]


def test_a_completion_of_several_messages_trains_its_replies_only(qwen):
    out = build_encoder(qwen)({"prompt": CHAT[:1], "completion": CHAT[1:]})
    assert [qwen.decode(run) for run in trained_runs(out["labels"])] == ["Blue.<|im_end|>\n", "Red.<|im_end|>\n"]


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "Name a colour.", "completion": " Blue."},
        {"prompt": CHAT[:3], "completion": CHAT[3:]},
        {"messages": CHAT},
    ],
    ids=["text", "conversational", "messages"],
)
def test_train_on_prompt_trains_every_token(qwen, row):
    out = build_encoder(qwen, train_on_prompt=True)(row)
    assert out["labels"] == out["input_ids"]
    assert out["input_ids"] == build_encoder(qwen)(row)["input_ids"]


@pytest.mark.parametrize(
    ("row", "error", "match", "reason"),
    [
        ({"prompt": CHAT[:3], "completion": "Red."}, TypeError, r"row 7: field 'prompt' is a list of messages, so "
         r"field 'completion' must be one too, got str 'Red.'", "wrong_type"),
        ({"prompt": CHAT[:3], "completion": []}, ValueError, r"row 7: field 'completion' is empty", "empty_field"),
        ({"prompt": CHAT[:2], "completion": [CHAT[2]]}, ValueError,
         r"row 7: fields 'prompt' \+ 'completion': the last message \(2, user\) is not an assistant reply",
         "ends_without_reply"),
        ({"prompt": "Name a colour.", "completion": CHAT[1:2]}, TypeError,
         r"row 7: field 'completion' must be a string, got list", "wrong_type"),
    ],
    ids=["completion_not_a_list", "empty_completion", "completion_ends_on_a_user_turn", "text_prompt_chat_completion"],
)
def test_bad_prompt_completion_rows_name_the_fields(qwen, row, error, match, reason):
    encoder = build_encoder(qwen, format="prompt_completion")
    with pytest.raises(error, match=match) as caught:
        encoder(row, index=7)
    assert isinstance(caught.value, RowError) and caught.value.reason == reason
    assert build_encoder(qwen, format="prompt_completion", on_error="skip")(row, index=7).reason == reason


def test_conversations_need_a_chat_template(tokenizer_dir):
    gpt2 = AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))
    encoder = build_encoder(gpt2, format="prompt_completion")
    assert encoder({"prompt": "a", "completion": " b"})["labels"][-2:] == [gpt2.encode(" b")[0], gpt2.eos_token_id]
    with pytest.raises(RowError, match="no chat template; pass chat_template=") as caught:
        encoder({"prompt": CHAT[:3], "completion": CHAT[3:]})
    assert caught.value.reason == "no_chat_template"
