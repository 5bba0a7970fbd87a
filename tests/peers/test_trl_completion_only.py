"""TRL 0.x's tests of `DataCollatorForCompletionOnlyLM`, ported to flatcollate's class of the same name.

Upstream: huggingface/trl v0.19.1 (commit accf7383a33c618a2edc7205107120b5f32e28a3):
`tests/test_data_collator_completion_only.py` (the whole file) and the collator tests of `tests/test_sft_trainer.py`
(`test_data_collator_completion_lm`, `..._with_multiple_text`, `test_data_collator_chat_completion_lm`,
`..._with_multiple_text`). Rewritten for pytest; the hub tokenizer `trl-internal-testing/tiny-Qwen2ForCausalLM-2.5`
is replaced by the real Qwen2.5 tokenizer in `../shared/data` (same vocabulary), so the tests run offline and skip
where that folder is absent.

TRL's class padded batches by default; flatcollate's flattens them unless `padding_free=False`. Every upstream test
runs padded, and also flattened where it does not read padded rows. Where flatcollate deliberately differs, the test
asserts flatcollate's behaviour and says so; docs/peers.md lists each difference and why.
"""

import copy

import pytest
import torch
from transformers import AutoTokenizer

from flatcollate import DataCollatorForCompletionOnlyLM

BOTH_MODES = pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "flattened"])

SYSTEM_USER_ASSISTANT = (
    "### System: You are a helpful assistant.\n\n### User: How much is 2+2?\n\n### Assistant: 2+2 equals 4"
)
INSTRUCTION_RESPONSE = (
    "\n\n### Instructions:\nHello all this should be masked\n\n### Response:\nI have not been masked correctly."
)
LONGER_INSTRUCTION_RESPONSE = (
    "\n\n### Instructions:\nThis is another longer text that should also be masked. This text is significantly "
    "longer than\nthe previous one.\n\n### Response:\nI have not been masked correctly."
)
HUMAN_ASSISTANT_ONE_TURN = "### Human: Hello all this should be masked.### Assistant: I should not be masked."
HUMAN_ASSISTANT_TWO_TURNS = (
    HUMAN_ASSISTANT_ONE_TURN + "### Human: All this should be masked\ntoo.### Assistant: I should not be masked too."
)


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


def trained_text(tokenizer, labels: torch.Tensor) -> str:
    """The text of every label the loss sees, in order (labels equal the input ids wherever they are trained)."""
    return tokenizer.decode(labels[labels != -100])


@BOTH_MODES
def test_templates_given_as_ids_cut_from_their_context(qwen, padding_free):
    # upstream: test_data_collator_finds_response_template_llama2_tokenizer, first two collators
    # "\n### User:" / "\n### Assistant:" tokenized alone start with a newline token that the text merges into "\n\n";
    # the ids after it are what appears in the text. Examples are plain lists of ids, collated by `torch_call`.
    instruction_ids = qwen.encode("\n### User:", add_special_tokens=False)[1:]
    response_ids = qwen.encode("\n### Assistant:", add_special_tokens=False)[2:]
    ids = qwen.encode(SYSTEM_USER_ASSISTANT, add_special_tokens=False)

    single = DataCollatorForCompletionOnlyLM(response_ids, tokenizer=qwen, padding_free=padding_free)
    assert trained_text(qwen, single.torch_call([ids])["labels"]) == " 2+2 equals 4"
    multi = DataCollatorForCompletionOnlyLM(response_ids, instruction_ids, tokenizer=qwen, padding_free=padding_free)
    assert trained_text(qwen, multi.torch_call([ids])["labels"]) == " 2+2 equals 4"


@BOTH_MODES
def test_first_instruction_may_use_another_template(qwen, padding_free):
    # upstream: test_data_collator_finds_response_template_llama2_tokenizer, third collator
    # The first user turn's marker ("## User:") differs from the template: the first response is still trained.
    text = (
        "## User: First instruction\n\n### Assistant: First response\n\n### User: Second instruction\n\n"
        "### Assistant: Second response"
    )
    collator = DataCollatorForCompletionOnlyLM(
        qwen.encode("\n### Assistant:", add_special_tokens=False)[2:],
        qwen.encode("\n### User:", add_special_tokens=False)[1:],
        tokenizer=qwen,
        padding_free=padding_free,
    )
    batch = collator.torch_call([qwen.encode(text, add_special_tokens=False)])
    assert trained_text(qwen, batch["labels"]) == " First response\n\n Second response"


@BOTH_MODES
@pytest.mark.parametrize("instruction_template", [None, "\n### User:"])
def test_example_without_response_template(qwen, padding_free, instruction_template):
    # upstream: test_data_collator_handling_of_long_sequences
    # An example cut before its response: TRL warned and trained nothing on it.
    text = (
        "### System: You are a helpful assistant.\n\n### User: How much is 2+2? I'm asking because I'm not sure. "
        "And I'm not sure because I'm not good at math.\n"
    )
    ids = qwen.encode(text, add_special_tokens=False)
    options = {"tokenizer": qwen, "padding_free": padding_free}
    masking = DataCollatorForCompletionOnlyLM(
        "\n### Assistant:", instruction_template, on_missing_template="mask", **options
    )
    with pytest.warns(UserWarning) as record:
        batch = masking.torch_call([ids])
    messages = [str(warning.message) for warning in record]
    assert any("response template '\\n### Assistant:' not found in example(s) [0]" in m for m in messages)
    # Deliberately different: TRL missed the instruction template too ("\n\n### User:" tokenizes apart from
    # "\n### User:"); flatcollate finds string templates by characters, so only the response template is missing.
    assert not any("instruction template" in m for m in messages)
    assert (batch["labels"] == -100).all()
    # Deliberately different: by default flatcollate raises, naming the example and the fix, instead of training
    # silently on fewer examples than the batch holds.
    with pytest.raises(ValueError, match=r"example 0: response template .* not found .* on_missing_template='mask'"):
        DataCollatorForCompletionOnlyLM("\n### Assistant:", instruction_template, **options).torch_call([ids])


def test_flattened_batch_is_the_padded_batch_without_padding(qwen):
    # upstream: test_padding_free
    texts = [
        "### System: You are a helpful assistant.\n\n### User: How much is 2+2?\n\n### Assistant: 2+2 equals 4",
        "### System: You are a honest and helpful assistant.\n\n### User: What is the answer of 22x22?\n\n"
        "### Assistant: 22x22 equals 484",
    ]
    examples = [qwen(text, add_special_tokens=False) for text in texts]  # BatchEncoding: ids and an attention mask
    padded = DataCollatorForCompletionOnlyLM("### Assistant:", tokenizer=qwen, padding_free=False)(examples)
    flat = DataCollatorForCompletionOnlyLM("### Assistant:", tokenizer=qwen, padding_free=True)(examples)

    assert "attention_mask" not in flat
    assert {"input_ids", "labels", "position_ids"} <= set(flat)
    assert flat["input_ids"].shape == flat["labels"].shape == flat["position_ids"].shape
    real = padded["attention_mask"].bool()
    torch.testing.assert_close(flat["input_ids"], padded["input_ids"][real][None])
    torch.testing.assert_close(flat["position_ids"], (padded["attention_mask"].cumsum(1) - 1)[real][None])
    rows = [row_labels[row_mask].clone() for row_labels, row_mask in zip(padded["labels"], real, strict=True)]
    for row in rows:
        row[0] = -100  # a flattened row's sequences are separated by an ignored first label
    torch.testing.assert_close(flat["labels"], torch.cat(rows)[None])


def test_flattened_boundaries(qwen):
    # upstream: test_data_collator_for_completion_only_lm
    collator = DataCollatorForCompletionOnlyLM(qwen.decode(9999), tokenizer=qwen, padding_free=True)
    examples = [
        {"input_ids": [1, 2, 3, 9999, 4, 5], "attention_mask": [1] * 6},
        {"input_ids": [6, 7, 8, 9, 9999, 10, 11], "attention_mask": [1] * 7},
    ]
    batch = collator(examples)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6]]
    # Deliberately different: the layout of `transformers.DataCollatorWithFlattening` (what transformers' attention
    # reads): `cu_seq_lens_q/k` of shape (N + 1,) int32 where TRL returned (1, N + 1), and `max_length_q/k` as Python
    # ints where TRL returned a 1-element tensor.
    torch.testing.assert_close(batch["cu_seq_lens_q"], torch.tensor([0, 6, 13], dtype=torch.int32))
    torch.testing.assert_close(batch["cu_seq_lens_k"], torch.tensor([0, 6, 13], dtype=torch.int32))
    assert batch["max_length_q"] == batch["max_length_k"] == 7
    assert type(batch["max_length_q"]) is int


@BOTH_MODES
def test_completion_after_response_template(qwen, padding_free):
    # upstream: test_sft_trainer.py: test_data_collator_completion_lm
    collator = DataCollatorForCompletionOnlyLM("### Response:\n", tokenizer=qwen, mlm=False, padding_free=padding_free)
    batch = collator([qwen(INSTRUCTION_RESPONSE)])
    last_masked = int(torch.nonzero(batch["labels"][0] == -100)[-1])
    assert qwen.decode(batch["input_ids"][0, last_masked + 1 :]) == "I have not been masked correctly."


def test_left_padding_leaves_each_completion_at_the_end_of_its_row(qwen):
    # upstream: test_sft_trainer.py: test_data_collator_completion_lm_with_multiple_text
    tokenizer = copy.deepcopy(qwen)
    tokenizer.padding_side = "left"
    collator = DataCollatorForCompletionOnlyLM("### Response:\n", tokenizer=tokenizer, mlm=False, padding_free=False)
    batch = collator([tokenizer(INSTRUCTION_RESPONSE), tokenizer(LONGER_INSTRUCTION_RESPONSE)])
    for row in range(2):
        last_masked = int(torch.nonzero(batch["labels"][row] == -100)[-1])
        assert tokenizer.decode(batch["input_ids"][row, last_masked + 1 :]) == "I have not been masked correctly."
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][:, -1].all()


@BOTH_MODES
def test_multi_turn_trains_every_assistant_turn(qwen, padding_free):
    # upstream: test_sft_trainer.py: test_data_collator_chat_completion_lm
    collator = DataCollatorForCompletionOnlyLM(
        response_template="### Assistant:",
        instruction_template="### Human:",
        tokenizer=qwen,
        mlm=False,
        padding_free=padding_free,
    )
    batch = collator([qwen(HUMAN_ASSISTANT_TWO_TURNS)])
    trained = batch["input_ids"][batch["labels"] != -100]
    assert qwen.decode(trained) == " I should not be masked. I should not be masked too."


def test_multi_turn_rows_left_padded(qwen):
    # upstream: test_sft_trainer.py: test_data_collator_chat_completion_lm_with_multiple_text
    tokenizer = copy.deepcopy(qwen)
    tokenizer.padding_side = "left"
    collator = DataCollatorForCompletionOnlyLM(
        response_template="### Assistant:",
        instruction_template="### Human:",
        tokenizer=tokenizer,
        mlm=False,
        padding_free=False,
    )
    batch = collator([tokenizer(HUMAN_ASSISTANT_ONE_TURN), tokenizer(HUMAN_ASSISTANT_TWO_TURNS)])
    first, second = (ids[labels != -100] for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True))
    assert tokenizer.decode(first) == " I should not be masked."
    assert tokenizer.decode(second) == " I should not be masked. I should not be masked too."
