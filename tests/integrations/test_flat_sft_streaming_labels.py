"""`FlatSFTTrainer` and `StreamingPacker(encode_fn=build_encoder(...))` train the same tokens of the same rows.

Each row's sequence is read from FlatSFTTrainer's train dataloader (TRL prepares the rows, flatcollate collates) and
from a streaming packer over the same rows (mapped back to its row by `example_ids`, packs split by the collator's
`cu_seq_lens_q`), both as the model receives them: after a flattening collator, which drops the loss of every
sequence's first token. `input_ids` must be identical and labels identical, or differ by exactly the tokens that
docs/streaming.md ("Same labels as FlatSFTTrainer") names, with the reason:

- Qwen2.5 `messages` rows with `assistant_only_loss=True`: TRL's `qwen2_5_training.jinja` also marks the `\\n` that
  ends each reply's generation prompt `<|im_start|>assistant\\n`; flatcollate leaves the generation prompt to the
  prompt. One token per reply.
- text prompt/completion rows whose prompt alone tokenizes differently at its end (`"Answer:  "`, two spaces, one
  token alone, two before a completion): TRL trains the completion from where the two tokenizations part, so also
  the prompt tokens after that point.
- conversational prompt/completion rows whose completion holds more than one reply: TRL trains the whole completion,
  the user turn between the replies included; with `assistant_only_loss=True`, the replies and, with Qwen2.5, the
  header `\n` of each reply after the completion's first.
"""

import itertools
import json
import tempfile

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl.chat_template_utils import get_training_chat_template

from flatcollate import DataCollatorWithFlattening
from flatcollate.data import build_encoder
from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.streaming import StreamingPacker

from .test_flat_sft_labels import COMPLETIONS, PROMPTS, batches, chat

PACK_LEN = 8192  # longer than every row used here: no row is split, so each row is one sequence on both sides
NUM_CHATS = 40  # HH-RLHF conversations (94 replies)


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    """Qwen2.5 with its shipped template: TRL swaps in `qwen2_5_training.jinja` for `assistant_only_loss`."""
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.fixture(scope="module")
def llama(tokenizer_dir, shared_data):
    """Llama-3.2 with `llama3_training.jinja`, the template a user sets for `assistant_only_loss` (TRL has no training
    variant of the shipped Llama-3.2 template: `test_trl_refuses_the_shipped_llama_3_2_template`)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("llama-3.2-instruct"))
    tokenizer.chat_template = (shared_data / "chat_templates" / "llama3_training.jinja").read_text()
    return tokenizer


@pytest.fixture(scope="module")
def rows(shared_data):
    """Row sets by TRL dataset format: real HH-RLHF conversations and T0 prompts, plus short literal pairs."""
    with open(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl") as f:
        chats = [json.loads(line)["messages"] for line in itertools.islice(f, NUM_CHATS)]
    with open(shared_data / "datasets" / "t0_mix_7k.jsonl") as f:
        t0 = [json.loads(line) for line in itertools.islice(f, 30)]
    pairs = list(zip(PROMPTS, COMPLETIONS, strict=True))
    return {
        "messages": [{"messages": messages} for messages in chats],
        "prompt_completion": [{"prompt": p, "completion": c} for p, c in pairs]
        + [{"prompt": r["prompt"], "completion": r["completion"]} for r in t0 if r["completion"].strip()],
        "conversational_prompt_completion": [{"prompt": chat(p, c)[:3], "completion": chat(p, c)[3:]} for p, c in pairs]
        + [{"prompt": messages[:-1], "completion": messages[-1:]} for messages in chats[:20]],
    }


def sequences(batch):
    """A flattened batch's sequences as `(input_ids, labels)` pairs of `(length,)` int64 tensors, cut at
    `cu_seq_lens_q`."""
    cuts = batch["cu_seq_lens_q"].tolist()
    return [(batch["input_ids"][0, a:b], batch["labels"][0, a:b]) for a, b in itertools.pairwise(cuts)]


def trainer_sequences(tokenizer, rows, **config):
    """Each row's sequence in FlatSFTTrainer's batches (an iterable dataset: the dataloader keeps the rows' order)."""
    dataset = Dataset.from_list(rows).to_iterable_dataset()
    with tempfile.TemporaryDirectory() as tmp:
        found = [s for batch in batches(FlatSFTTrainer, tokenizer, dataset, tmp, **config) for s in sequences(batch)]
    assert len(found) == len(rows)
    return found


def packer_sequences(rows, encode_fn):
    """Each row's sequence in the streaming packer's packs, collated as docs/streaming.md shows."""
    packer = StreamingPacker(rows, pack_len=PACK_LEN, encode_fn=encode_fn, buffer_size=4, return_example_ids=True)
    collator, found = DataCollatorWithFlattening(), {}
    for pack in packer:
        example_ids = pack.pop("example_ids")
        for example_id, sequence in zip(example_ids, sequences(collator([pack])), strict=True):
            assert example_id not in found
            found[example_id] = sequence
    assert sorted(found) == list(range(len(rows)))
    return [found[i] for i in range(len(rows))]


def label_differences(ours, theirs):
    """Per row, the positions where the labels differ, after checking that the `input_ids` are identical."""
    assert len(ours) == len(theirs)
    out = []
    for row, ((ids, labels), (their_ids, their_labels)) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.equal(ids, their_ids), f"row {row}: input_ids differ"
        out.append(torch.nonzero(labels != their_labels).flatten().tolist())
    return out


SAME = [  # (tokenizer, rows, SFTConfig options, build_encoder options): the same labels for every row
    ("llama", "messages", {"assistant_only_loss": True}, {"format": "messages"}),
    *[(name, "messages", {"assistant_only_loss": False}, {"format": "messages", "train_on_prompt": True})
      for name in ("qwen", "llama")],
    *[(name, "prompt_completion", {"completion_only_loss": value},
       {"format": "prompt_completion", "train_on_prompt": value is False})
      for name in ("qwen", "llama") for value in (True, False, None)],
    *[(name, "conversational_prompt_completion", config, {"format": "prompt_completion", **options})
      for name in ("qwen", "llama")
      for config, options in (
          ({"completion_only_loss": None}, {}),
          ({"completion_only_loss": False}, {"train_on_prompt": True}),
          ({"assistant_only_loss": True}, {}),
      )],
]


def case_id(case):
    """`qwen-prompt_completion-completion_only_loss=False`."""
    name, kind, config, _ = case
    return "-".join([name, kind, *(f"{key}={value}" for key, value in config.items())])


@pytest.mark.parametrize(("name", "kind", "config", "options"), SAME, ids=[case_id(case) for case in SAME])
def test_same_labels(request, rows, name, kind, config, options):
    tokenizer = request.getfixturevalue(name)
    theirs = trainer_sequences(tokenizer, rows[kind], **config)
    ours = packer_sequences(rows[kind], build_encoder(tokenizer, **options))
    assert label_differences(ours, theirs) == [[]] * len(rows[kind])
    untrained = [int((labels == -100).sum()) for _, labels in ours]
    if options.get("train_on_prompt"):
        assert untrained == [1] * len(ours)  # only each sequence's first token, dropped by the collator
    else:
        assert max(untrained) > 1  # prompts are not trained


def test_trl_refuses_the_shipped_llama_3_2_template(tokenizer_dir):
    """The premise of the `llama` fixture: TRL has no training variant of the shipped Llama-3.2 template."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("llama-3.2-instruct"))
    with pytest.raises(ValueError, match="patching is not supported for this template"):
        get_training_chat_template(tokenizer)


def header_newlines(ids, tokenizer):
    """Positions of the `\\n` token ending every `<|im_start|>assistant\\n` (Qwen2.5's generation prompt) in `ids`."""
    header = torch.tensor(tokenizer.convert_tokens_to_ids(["<|im_start|>", "assistant", "Ċ"]))
    return (torch.nonzero((ids.unfold(0, 3, 1) == header).all(dim=1)).flatten() + 2).tolist()


def assert_only_header_newlines_differ(ours, theirs, tokenizer):
    """TRL trains each reply's header `\\n` and flatcollate does not; every other label is the same."""
    for row, ((ids, labels), (_, their_labels)) in enumerate(zip(ours, theirs, strict=True)):
        newlines = header_newlines(ids, tokenizer)
        assert torch.nonzero(labels != their_labels).flatten().tolist() == newlines, f"row {row}"
        assert (labels[newlines] == -100).all() and torch.equal(their_labels[newlines], ids[newlines]), f"row {row}"


def test_qwen_assistant_only_loss_differs_by_one_header_newline_per_reply(qwen, rows, shared_data):
    training_template = (shared_data / "chat_templates" / "qwen2_5_training.jinja").read_text()
    assert get_training_chat_template(qwen) == training_template  # the template TRL swaps in
    theirs = trainer_sequences(qwen, rows["messages"], assistant_only_loss=True)
    ours = packer_sequences(rows["messages"], build_encoder(qwen, format="messages"))
    label_differences(ours, theirs)
    assert_only_header_newlines_differ(ours, theirs, qwen)
    replies = sum(m["role"] == "assistant" for row in rows["messages"] for m in row["messages"])
    assert sum(len(header_newlines(ids, qwen)) for ids, _ in ours) == replies == 94

    # Negative control: TRL's labels with every trained span moved one token later are caught.
    shifted = []
    for ids, labels in theirs:
        trained = torch.zeros_like(ids, dtype=torch.bool)
        trained[1:] = labels[:-1] != -100
        shifted.append((ids, torch.where(trained, ids, -100)))
    with pytest.raises(AssertionError, match="row 0"):
        assert_only_header_newlines_differ(ours, shifted, qwen)


def trl_template_mask(row, *, tokenizer, chat_template):
    """An `encode_fn` giving TRL's labels: the template's own `{% generation %}` mask, folded into labels by the
    packer."""
    out = tokenizer.apply_chat_template(
        row["messages"], chat_template=chat_template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}


def test_qwen_paths_equal_with_one_label_rule(qwen, rows, shared_data):
    """Either rule on both paths gives the same labels: TRL's template mask through the packer, or flatcollate's
    encoder feeding FlatSFTTrainer (TRL keeps a dataset's `labels` as they are)."""
    chats = rows["messages"]
    template = (shared_data / "chat_templates" / "qwen2_5_training.jinja").read_text()
    theirs = trainer_sequences(qwen, chats, assistant_only_loss=True)
    ours = packer_sequences(chats, lambda row: trl_template_mask(row, tokenizer=qwen, chat_template=template))
    assert label_differences(ours, theirs) == [[]] * len(chats)

    encoder = build_encoder(qwen, format="messages")
    theirs = trainer_sequences(qwen, [encoder(row) for row in chats])
    ours = packer_sequences(chats, encoder)
    assert label_differences(ours, theirs) == [[]] * len(chats)


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_prompt_tail_that_tokenizes_differently_is_trained_by_trl_only(request, name):
    """`"Answer:  "` ends in one token `"  "` alone and in `" "`, `" yes"` before the completion: TRL trains from
    where the two tokenizations part, so the first space too; flatcollate trains the tokens overlapping the
    completion."""
    tokenizer = request.getfixturevalue(name)
    pairs = [{"prompt": "Answer:  ", "completion": "yes"}, {"prompt": "Answer: ", "completion": "yes"}]
    theirs = trainer_sequences(tokenizer, pairs, completion_only_loss=True)
    ours = packer_sequences(pairs, build_encoder(tokenizer, format="prompt_completion"))
    (position,), second = label_differences(ours, theirs)
    assert second == []
    ids, labels = ours[0]
    assert tokenizer.decode(ids[position : position + 2]) == "  yes"
    assert labels[position] == -100 and theirs[0][1][position] == ids[position]


def test_completion_with_a_user_turn_is_trained_whole_by_trl(qwen):
    """A completion `[reply, user, reply]`: TRL trains every completion token; flatcollate trains the two replies, not
    the user turn nor the second reply's generation prompt between them."""
    chats = [chat(p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    pairs = [{"prompt": messages[:1], "completion": messages[1:]} for messages in chats]
    theirs = trainer_sequences(qwen, pairs, completion_only_loss=True)
    ours = packer_sequences(pairs, build_encoder(qwen, format="prompt_completion"))
    for row, (positions, (ids, labels), (_, their_labels)) in enumerate(
        zip(label_differences(ours, theirs), ours, theirs, strict=True)
    ):
        assert positions == list(range(positions[0], positions[-1] + 1)), f"row {row}"
        assert qwen.decode(ids[positions]) == "<|im_start|>user\nAnd again?<|im_end|>\n<|im_start|>assistant\n"
        assert (labels[positions] == -100).all() and torch.equal(their_labels[positions], ids[positions])


def test_completion_with_a_user_turn_and_assistant_only_loss(qwen):
    """With `assistant_only_loss=True` TRL trains the completion's replies only, as flatcollate does, plus the header
    `\\n` of the second reply (the first reply's header is the prompt's generation prompt, outside the completion)."""
    chats = [chat(p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    pairs = [{"prompt": messages[:1], "completion": messages[1:]} for messages in chats]
    theirs = trainer_sequences(qwen, pairs, assistant_only_loss=True)
    ours = packer_sequences(pairs, build_encoder(qwen, format="prompt_completion"))
    for row, (positions, (ids, labels), (_, their_labels)) in enumerate(
        zip(label_differences(ours, theirs), ours, theirs, strict=True)
    ):
        first, second = header_newlines(ids, qwen)
        assert positions == [second], f"row {row}"
        assert labels[second] == -100 and their_labels[second] == ids[second] and labels[first] == -100
