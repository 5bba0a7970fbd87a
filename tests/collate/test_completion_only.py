from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate import DataCollatorForCompletionOnlyLM, DataCollatorWithFlattening
from flatcollate.collate.response_templates import completion_mask_turns, find_subsequence

R = [90, 91]  # response template ids
U = [80, 81]  # instruction template ids


def reference_completion_labels(ids, response, instruction=None):
    """Per-token loop: trained after a response template, until an instruction template starts."""
    ids = list(ids)
    labels = [-100] * len(ids)
    if instruction is None:
        ends = [i + len(response) for i in range(len(ids)) if ids[i : i + len(response)] == response]
        for i in range(ends[-1], len(ids)):
            labels[i] = ids[i]
        return labels
    trained = False
    i = 0
    while i < len(ids):
        if ids[i : i + len(instruction)] == instruction:
            trained = False
        if ids[i : i + len(response)] == response:
            for j in range(i, i + len(response)):
                labels[j] = -100
            i += len(response)
            trained = True
            continue
        labels[i] = ids[i] if trained else -100
        i += 1
    return labels


def test_find_subsequence_matches_loop():
    rng = np.random.default_rng(0)
    for _ in range(200):
        seq = rng.integers(0, 3, int(rng.integers(0, 30)))
        pat = rng.integers(0, 3, int(rng.integers(1, 4)))
        expected = [i for i in range(len(seq) - len(pat) + 1) if list(seq[i : i + len(pat)]) == list(pat)]
        assert find_subsequence(seq, pat).tolist() == expected


def test_single_turn_masks_up_to_last_response_template():
    collator = DataCollatorForCompletionOnlyLM(R)
    ids = [1, 2, *R, 3, 4, *R, 5, 6]
    batch = collator([{"input_ids": ids}])
    assert batch["labels"].tolist() == [[-100] * 8 + [5, 6]]
    assert batch["labels"].tolist()[0] == reference_completion_labels(ids, R)


def test_multi_turn_matches_reference_on_random_dialogues():
    rng = np.random.default_rng(1)
    collator = DataCollatorForCompletionOnlyLM(R, U, return_tensors="np")
    for _ in range(50):
        ids = []
        for _turn in range(int(rng.integers(1, 4))):
            ids += U + rng.integers(0, 50, int(rng.integers(0, 6))).tolist()
            ids += R + rng.integers(0, 50, int(rng.integers(0, 6))).tolist()
        expected = reference_completion_labels(ids, R, U)
        expected[0] = -100  # separator
        assert collator([{"input_ids": ids}])["labels"][0].tolist() == expected


def test_multi_turn_literal():
    keep = completion_mask_turns(9, np.array([2, 7]), np.array([0, 5]))
    assert keep.astype(int).tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_existing_labels_keep_their_masks():
    batch = DataCollatorForCompletionOnlyLM(R)([{"input_ids": [1, *R, 5, 6, 7], "labels": [1, 90, 91, 5, -100, 7]}])
    assert batch["labels"].tolist() == [[-100, -100, -100, 5, -100, 7]]


def test_missing_template_error_and_mask_policies():
    features = [{"input_ids": [1, *R, 2]}, {"input_ids": [3, 4, 5]}]
    with pytest.raises(ValueError, match=r"example 1: response template .* not found.*token ids"):
        DataCollatorForCompletionOnlyLM(R)(features)
    with pytest.warns(UserWarning, match=r"example\(s\) \[1\]"):
        batch = DataCollatorForCompletionOnlyLM(R, on_missing_template="mask")(features)
    assert batch["labels"].tolist() == [[-100, -100, -100, 2, -100, -100, -100]]


@pytest.mark.parametrize("padding_free", [True, False])
def test_missing_instruction_template_follows_on_missing_template(padding_free):
    # example 1 has a response template but no instruction template: TRL 0.x masked it whole, with a warning
    features = [{"input_ids": [*U, 1, *R, 2]}, {"input_ids": [3, *R, 4, 5]}]
    options = {"tokenizer": SimpleNamespace(pad_token_id=0), "padding_free": padding_free}
    with pytest.raises(ValueError, match=r"example 1: instruction template \[80, 81\] not found in 'input_ids'"):
        DataCollatorForCompletionOnlyLM(R, U, **options)(features)
    with pytest.warns(UserWarning, match=r"instruction template \[80, 81\] not found in example\(s\) \[1\]"):
        batch = DataCollatorForCompletionOnlyLM(R, U, on_missing_template="mask", **options)(features)
    expected = [[-100] * 5 + [2] + [-100] * 5] if padding_free else [[-100] * 5 + [2], [-100] * 6]
    torch.testing.assert_close(batch["labels"], torch.tensor(expected))


def test_example_missing_both_templates_is_reported_for_each():
    features = [{"input_ids": [*U, 1, *R, 2]}, {"input_ids": [3, 4]}, {"input_ids": [*U, 5]}]
    with pytest.raises(ValueError, match=r"example 1: response template \[90, 91\] not found"):
        DataCollatorForCompletionOnlyLM(R, U)(features)
    with pytest.warns(UserWarning) as record:
        batch = DataCollatorForCompletionOnlyLM(R, U, on_missing_template="mask")(features)
    messages = " ".join(str(w.message) for w in record)
    assert "response template [90, 91] not found in example(s) [1, 2]" in messages
    assert "instruction template [80, 81] not found in example(s) [1]" in messages
    assert batch["labels"].tolist() == [[-100] * 5 + [2] + [-100] * 5]


@pytest.mark.parametrize("padding_free", [True, False])
def test_custom_ignore_index_marks_every_masked_label(padding_free):
    collator = DataCollatorForCompletionOnlyLM(
        R, ignore_index=-1, tokenizer=SimpleNamespace(pad_token_id=0), padding_free=padding_free
    )
    batch = collator([{"input_ids": [1, *R, 5, 6], "labels": [1, 90, 91, -100, 6]}, {"input_ids": [*R, 7]}])
    expected = [[-1, -1, -1, -1, 6, -1, -1, 7]] if padding_free else [[-1, -1, -1, -1, 6], [-1, -1, 7, -1, -1]]
    torch.testing.assert_close(batch["labels"], torch.tensor(expected))


@pytest.mark.parametrize("instruction", [None, U])
def test_packed_examples_match_reference_per_sequence(instruction):
    """Each sequence of a packed example (`seq_lengths`) is masked on its own, as if it were an example."""
    rng = np.random.default_rng(2)
    collator = DataCollatorForCompletionOnlyLM(R, instruction, return_tensors="np")
    for _ in range(30):
        sequences = []
        for _seq in range(int(rng.integers(1, 4))):
            ids = []
            for _turn in range(int(rng.integers(1, 3))):
                ids += (U if instruction else []) + rng.integers(0, 50, int(rng.integers(0, 4))).tolist()
                ids += R + rng.integers(0, 50, int(rng.integers(0, 4))).tolist()
            sequences.append(ids)
        expected, input_ids = [], []
        for ids in sequences:
            expected += [-100, *reference_completion_labels(ids, R, instruction)[1:]]  # separator first
            input_ids += ids
        packed = {"input_ids": input_ids, "seq_lengths": [len(ids) for ids in sequences]}
        assert collator([packed])["labels"][0].tolist() == expected


def test_packed_example_literal_and_missing_template_per_sequence():
    packed = {"input_ids": [*U, 1, *R, 5, 2, 3, *U, 4, *R, 7], "seq_lengths": [6, 8]}
    labels = DataCollatorForCompletionOnlyLM(R, U)([packed])["labels"].tolist()
    assert labels == [[-100] * 5 + [5] + [-100] * 7 + [7]]  # the second prompt (2, 3, ...) is not trained
    # sequence 1 lacks the response template; the one straddling the boundary (90 | 91) does not count
    packed = {"input_ids": [1, *R, 5, 2, 90, 91, 3], "seq_lengths": [4, 2, 2]}
    with pytest.raises(ValueError, match=r"example 0: response template \[90, 91\] not found in 'input_ids' "
                                         r"\(packed sequence\(s\) \[1, 2\]\)"):
        DataCollatorForCompletionOnlyLM(R)([packed])
    with pytest.warns(UserWarning, match=r"response template \[90, 91\] not found in example\(s\) \[0\]"):
        batch = DataCollatorForCompletionOnlyLM(R, on_missing_template="mask")([packed])
    assert batch["labels"].tolist() == [[-100, -100, -100, 5, -100, -100, -100, -100]]


def test_padded_mode_matches_per_example_reference_on_random_lengths():
    rng = np.random.default_rng(3)
    collator = DataCollatorForCompletionOnlyLM(R, tokenizer=SimpleNamespace(pad_token_id=0), padding_free=False,
                                               return_tensors="np")
    for _ in range(30):
        examples = [rng.integers(1, 50, int(rng.integers(0, 6))).tolist() + R
                    + rng.integers(1, 50, int(rng.integers(0, 12))).tolist() for _ in range(int(rng.integers(1, 6)))]
        batch = collator([{"input_ids": ids} for ids in examples])
        width = max(len(ids) for ids in examples)
        for row, ids in enumerate(examples):  # one example at a time, padded by hand
            pad = width - len(ids)
            assert batch["input_ids"][row].tolist() == ids + [0] * pad
            assert batch["labels"][row].tolist() == reference_completion_labels(ids, R) + [-100] * pad
            assert batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * pad


def test_flattened_output_has_all_boundary_keys():
    batch = DataCollatorForCompletionOnlyLM(R)([{"input_ids": [1, *R, 2]}, {"input_ids": [*R, 7]}])
    flat = DataCollatorWithFlattening()([{"input_ids": [1, *R, 2]}, {"input_ids": [*R, 7]}])
    assert set(batch) == set(flat)
    torch.testing.assert_close(batch["position_ids"], flat["position_ids"])
    torch.testing.assert_close(batch["cu_seq_lens_q"], flat["cu_seq_lens_q"])


def test_padded_mode_pads_with_attention_mask(tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=False)
    texts = ["Question: 2+2?\n### Answer: 4", "Q?\n### Answer: yes it is"]
    batch = collator([{"input_ids": tokenizer.encode(t)} for t in texts])
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert batch["attention_mask"].sum().item() == sum(len(tokenizer.encode(t)) for t in texts)


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "llama-3.2-instruct", "mistral-7b-instruct-v0.2", "gpt2"])
def test_string_template_found_in_context_on_real_tokenizers(tokenizer_dir, name):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(name))
    collator = DataCollatorForCompletionOnlyLM("### Response:", tokenizer=tokenizer)
    prompt = "Below is an instruction.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:"
    completion = " The sum is 5."
    ids = tokenizer.encode(prompt + completion, add_special_tokens=False)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(ids, labels, strict=True) if lab != -100]
    assert tokenizer.decode(trained).strip() == completion.strip()


def test_string_template_needs_tokenizer_and_mlm_refused():
    with pytest.raises(ValueError, match=r"a `tokenizer` is needed"):
        DataCollatorForCompletionOnlyLM("### Response:")
    with pytest.raises(ValueError, match="mlm=False"):
        DataCollatorForCompletionOnlyLM(R, mlm=True)
    with pytest.raises(ValueError, match="on_missing_template"):
        DataCollatorForCompletionOnlyLM(R, on_missing_template="skip")


ALPACA = "Below is an instruction that describes a task.\n\n### Instruction:\n{q}\n\n### Response:\n{a}"


def _trained_runs(tokenizer, ids, labels) -> list[str]:
    kept = np.flatnonzero(np.asarray(labels) != -100)
    runs = np.split(kept, np.flatnonzero(np.diff(kept) > 1) + 1)
    return [tokenizer.decode(np.asarray(ids)[run]) for run in runs if run.size]


def test_readme_snippet_finds_the_template_on_the_alpaca_layout_with_qwen(tokenizer_dir):
    """Qwen2.5 merges the template's ':' with the newline after it (':\\n' is one token): the template is found in
    the decoded text by character offsets; the token it shares with the completion belongs to the template."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    collator = DataCollatorForCompletionOnlyLM("### Response:", tokenizer=tokenizer)
    texts = [ALPACA.format(q="Say hi.", a="Hello there!"), ALPACA.format(q="Add 2 and 3.", a="5")]
    batch = collator([{"input_ids": tokenizer.encode(t, add_special_tokens=False)} for t in texts])
    assert _trained_runs(tokenizer, batch["input_ids"][0], batch["labels"][0]) == ["Hello there!", "5"]


def test_string_templates_by_offsets_multi_turn_and_packed(tokenizer_dir):
    """Instruction and response templates both merged with their neighbours, two turns, in a packed example of two
    sequences; the same template given as ids keeps the id search (and does not match here)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    collator = DataCollatorForCompletionOnlyLM("### Response:", "### Instruction:", tokenizer=tokenizer)
    text = "### Instruction:\nq1\n\n### Response:\na1\n\n### Instruction:\nq2\n\n### Response:\na2"
    ids = tokenizer.encode(text, add_special_tokens=False)
    example = {"input_ids": ids + ids, "seq_lengths": [len(ids), len(ids)]}
    labels = collator([example], return_tensors="np")["labels"][0]
    assert _trained_runs(tokenizer, ids + ids, labels) == ["a1\n\n", "a2", "a1\n\n", "a2"]
    by_id = DataCollatorForCompletionOnlyLM(tokenizer.encode("### Response:", add_special_tokens=False))
    with pytest.raises(ValueError, match=r"response template .* not found"):
        by_id([{"input_ids": ids}])
