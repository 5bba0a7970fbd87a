"""Per-example evaluation from flattened rows: `split_flattened_predictions` against padded evaluation.

A real `Trainer.predict` runs a tiny Llama once with the flattening collator and once with a padded collator
(`DataCollatorForSeq2Seq`); per-example predictions, labels and metrics must agree, for eval batch sizes that do not
divide the eval set. Literal rows padded by transformers' own `nested_concat` cover the edge cases and the refusals.
"""

import math
import tempfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments
from transformers.trainer_pt_utils import nested_concat

from flatcollate import IGNORE_INDEX, DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.synthetic import offline_tokenizer, synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import split_flattened_predictions

NUM_EXAMPLES = 11  # a multiple of no eval batch size below: the last batch is short
TOL = 1e-5


@pytest.fixture(scope="module")
def eval_dataset():
    return synthetic_sft_dataset(NUM_EXAMPLES, max_tokens=40, seed=3)


@pytest.fixture(scope="module")
def lengths(eval_dataset):
    return [len(ids) for ids in eval_dataset["input_ids"]]


def example_metrics(predictions: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """`(token accuracy, mean token loss)` of one example: position `t` predicts `labels[t + 1]`, -100 skipped.

    `predictions` are logits `(n, V)` or argmax ids `(n,)`; the loss is NaN for ids.
    """
    targets = labels[1:]
    keep = targets != IGNORE_INDEX
    if predictions.ndim == 2:
        logits = torch.from_numpy(predictions[:-1][keep])
        loss = F.cross_entropy(logits, torch.from_numpy(targets[keep])).item()
        ids = predictions.argmax(-1)
    else:
        loss, ids = math.nan, predictions
    return float((ids[:-1][keep] == targets[keep]).mean()), loss


def predict(mode: str, dataset, *, batch_size: int, argmax: bool, compute_metrics=None):
    """`Trainer.predict` of a tiny Llama: `mode` is `"flattened"` (prepared model) or `"padded"` (its twin)."""
    model = tiny_causal_lm("llama", seed=0)
    if mode == "flattened":
        collator = DataCollatorWithFlattening()
        prepare_model_for_flattening(model)
    else:
        collator = DataCollatorForSeq2Seq(offline_tokenizer(), label_pad_token_id=IGNORE_INDEX)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_eval_batch_size=batch_size, report_to=[], use_cpu=True, disable_tqdm=True
        )
        trainer = Trainer(
            model=model,
            args=args,
            data_collator=collator,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=(lambda logits, labels: logits.argmax(-1)) if argmax else None,
        )
        return trainer.predict(dataset)


def padded_examples(output, lengths) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Padded evaluation, per example: row `i` cut to the example's length (right padding)."""
    return (
        [output.predictions[i, :n] for i, n in enumerate(lengths)],
        [output.label_ids[i, :n] for i, n in enumerate(lengths)],
    )


@pytest.mark.parametrize("argmax", [False, True], ids=["logits", "argmax_ids"])
@pytest.mark.parametrize("batch_size", [2, 3, 4])
def test_per_example_metrics_equal_padded_evaluation(eval_dataset, lengths, batch_size, argmax):
    scores = {}

    def metrics_from_split(prediction):
        """What a user's `compute_metrics` does: split the rows, then score each example."""
        preds, labels = split_flattened_predictions(prediction.predictions, prediction.label_ids, lengths=lengths)
        scores["flattened"] = [example_metrics(p, lab) for p, lab in zip(preds, labels, strict=True)]
        return {"example_accuracy": float(np.mean([accuracy for accuracy, _ in scores["flattened"]]))}

    flat = predict("flattened", eval_dataset, batch_size=batch_size, argmax=argmax, compute_metrics=metrics_from_split)
    padded = predict("padded", eval_dataset, batch_size=batch_size, argmax=argmax)

    assert flat.predictions.shape[0] == math.ceil(NUM_EXAMPLES / batch_size)  # one row per eval batch
    assert padded.predictions.shape[0] == NUM_EXAMPLES
    # The evaluation loss is exact with the flattening collator, helper or not.
    torch.testing.assert_close(flat.metrics["test_loss"], padded.metrics["test_loss"], rtol=TOL, atol=TOL)

    preds, labels = split_flattened_predictions(flat.predictions, flat.label_ids, lengths=lengths)
    ref_preds, ref_labels = padded_examples(padded, lengths)
    assert len(preds) == len(labels) == NUM_EXAMPLES
    for i, (p, lab, ref_p, ref_lab) in enumerate(zip(preds, labels, ref_preds, ref_labels, strict=True)):
        assert p.shape == ref_p.shape, i
        np.testing.assert_allclose(p, ref_p, atol=TOL, rtol=0, err_msg=f"example {i}")
        assert lab[0] == IGNORE_INDEX, i  # the separator; causal LMs never score a sequence's first label
        np.testing.assert_array_equal(lab[1:], ref_lab[1:], err_msg=f"example {i}")

    reference = [example_metrics(p, lab) for p, lab in zip(ref_preds, ref_labels, strict=True)]
    assert len(scores["flattened"]) == NUM_EXAMPLES
    np.testing.assert_allclose(scores["flattened"], reference, atol=TOL, rtol=0)
    assert flat.metrics["test_example_accuracy"] == pytest.approx(np.mean([a for a, _ in reference]), abs=TOL)


@pytest.mark.parametrize("batch_size", [2, 3, 4])
def test_raw_rows_give_per_batch_metrics(eval_dataset, lengths, batch_size):
    """Negative control: scoring the rows as they come gives one value per eval batch, not one per example."""
    flat = predict("flattened", eval_dataset, batch_size=batch_size, argmax=False)
    padded = predict("padded", eval_dataset, batch_size=batch_size, argmax=False)
    rows = [example_metrics(p, lab) for p, lab in zip(flat.predictions, flat.label_ids, strict=True)]
    reference = [example_metrics(p, lab) for p, lab in zip(*padded_examples(padded, lengths), strict=True)]
    assert len(rows) == math.ceil(NUM_EXAMPLES / batch_size) != len(reference)
    # Row 0 pools the first `batch_size` examples: its loss is their token-weighted mean, not the first example's.
    assert abs(rows[0][1] - reference[0][1]) > 1e-3


def test_shifted_boundaries_are_refused_or_fail_the_comparison(eval_dataset, lengths):
    """Negative control: lengths off by one. Each is refused, except a boundary moved inside a masked prompt (no
    check can see it from predictions and labels), whose per-example arrays then differ from padded evaluation."""
    batch_size = 3
    flat = predict("flattened", eval_dataset, batch_size=batch_size, argmax=True)
    padded = predict("padded", eval_dataset, batch_size=batch_size, argmax=True)
    labels = eval_dataset["labels"]
    assert labels[0][-1] != IGNORE_INDEX and labels[1][1] == IGNORE_INDEX  # trained last token, masked prompt

    def split(shifted):
        return split_flattened_predictions(flat.predictions, flat.label_ids, lengths=shifted)

    one_more = [*lengths[:-1], lengths[-1] + 1]
    with pytest.raises(ValueError, match=r"`lengths` add up to \d+ tokens for 11 examples, but the predictions hold"):
        split(one_more)
    across_batches = [*lengths[:2], lengths[2] + 1, lengths[3] - 1, *lengths[4:]]
    with pytest.raises(ValueError, match=r"row 0 \(eval batch 0\) ends at token \d+, inside example 2"):
        split(across_batches)
    onto_trained_label = [lengths[0] - 1, lengths[1] + 1, *lengths[2:]]
    with pytest.raises(ValueError, match=r"example 1: its first label .* is \d+, not the separator -100"):
        split(onto_trained_label)

    into_prompt = [lengths[0] + 1, lengths[1] - 1, *lengths[2:]]
    preds, _ = split(into_prompt)
    ref_preds, _ = padded_examples(padded, lengths)
    assert [len(p) for p in preds[:2]] != [len(p) for p in ref_preds[:2]]
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(preds[1], ref_preds[1][: len(preds[1])])


def flattened_rows(examples, batch_sizes, *, separator_id=IGNORE_INDEX):
    """What `Trainer.predict` hands `compute_metrics`: each batch concatenated into one `(1, T_b, ...)` row, the
    labels' first entry per example set to `separator_id`, rows padded with -100 by transformers' `nested_concat`."""
    predictions, labels, start = None, None, 0
    for size in batch_sizes:
        batch = examples[start : start + size]
        start += size
        row_labels = []
        for _, lab in batch:
            lab = lab.copy()
            if separator_id is not None:
                lab[0] = separator_id
            row_labels.append(lab)
        row_preds = torch.from_numpy(np.concatenate([p for p, _ in batch]))[None]
        row_labels = torch.from_numpy(np.concatenate(row_labels))[None]
        predictions = row_preds if predictions is None else nested_concat(predictions, row_preds, padding_index=-100)
        labels = row_labels if labels is None else nested_concat(labels, row_labels, padding_index=-100)
    return predictions.numpy(), labels.numpy()


def random_examples(lengths, *, seed, vocab=0):
    """`(predictions, labels)` per example: logits `(n, vocab)` float32, or ids `(n,)` when `vocab` is 0."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        labels = np.where(rng.random(n) < 0.3, IGNORE_INDEX, rng.integers(0, 50, n))
        preds = rng.standard_normal((n, vocab)).astype(np.float32) if vocab else rng.integers(0, 50, n)
        out.append((preds, labels))
    return out


CASES = {
    # name: (lengths, batch sizes)
    "random_mix": ([7, 1, 30, 12, 2, 19, 5, 3, 11], [4, 4, 1]),
    "one_example": ([16], [1]),
    "length_one": ([1, 1, 1, 1, 1], [2, 2, 1]),
    "many_tiny": ([1, 2, 1, 3] * 6, [5, 5, 5, 5, 4]),
    "widest_row_last": ([2, 3, 40], [2, 1]),
    "token_budget_batches": ([9, 8, 2, 2, 2, 2, 17], [1, 1, 4, 1]),
}


@pytest.mark.parametrize("vocab", [0, 6], ids=["ids", "logits"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_recovers_every_example(case, vocab):
    lengths, batch_sizes = CASES[case]
    examples = random_examples(lengths, seed=len(case), vocab=vocab)
    predictions, labels = flattened_rows(examples, batch_sizes)
    assert predictions.shape[0] == len(batch_sizes)

    preds, labs = split_flattened_predictions(predictions, labels, lengths=np.array(lengths))
    assert len(preds) == len(labs) == len(lengths)
    for i, ((p, lab), got_p, got_lab) in enumerate(zip(examples, preds, labs, strict=True)):
        np.testing.assert_array_equal(got_p, p, err_msg=f"example {i}")
        assert got_lab[0] == IGNORE_INDEX
        np.testing.assert_array_equal(got_lab[1:], lab[1:], err_msg=f"example {i}")


def test_separator_none_keeps_first_labels():
    examples = random_examples([3, 4, 2], seed=1)
    for i, (_, lab) in enumerate(examples):
        lab[0] = 7 + i  # labelled first tokens, as token-classification collators keep them
    predictions, labels = flattened_rows(examples, [2, 1], separator_id=None)
    with pytest.raises(ValueError, match=r"example 0: its first label .* is 7, not the separator -100"):
        split_flattened_predictions(predictions, labels, lengths=[3, 4, 2])
    _, labs = split_flattened_predictions(predictions, labels, lengths=[3, 4, 2], separator_id=None)
    assert [lab.tolist() for lab in labs] == [lab.tolist() for _, lab in examples]


def test_bad_input_is_refused():
    examples = random_examples([3, 4, 2], seed=2, vocab=5)
    examples[2][1][1] = 9  # row 1 holds example 2 alone: a trained label at its token 1
    predictions, labels = flattened_rows(examples, [2, 1])
    with pytest.raises(TypeError, match=r"predictions is a tuple of 2 arrays: pass one array .* `predictions\[0\]`"):
        split_flattened_predictions((predictions, predictions), labels, lengths=[3, 4, 2])
    with pytest.raises(ValueError, match=r"shape \(2, 6, 5\) do not start with the shape of label_ids \(2, 7\)"):
        split_flattened_predictions(predictions[:, :-1], labels, lengths=[3, 4, 2])
    with pytest.raises(ValueError, match="label_ids must be integers of shape"):
        split_flattened_predictions(predictions, labels.astype(np.float32), lengths=[3, 4, 2])
    with pytest.raises(ValueError, match="example 1: length 0"):
        split_flattened_predictions(predictions, labels, lengths=[3, 0, 2])
    with pytest.raises(ValueError, match="lengths must be a non-empty 1-D sequence of ints"):
        split_flattened_predictions(predictions, labels, lengths=[])
    shifted = predictions.copy()
    shifted[1, 1:] = -100  # predictions of row 1 cut short (e.g. shifted), its labels not
    with pytest.raises(ValueError, match=r"row 1 of `label_ids` has labels after token 1, where `predictions` is"):
        split_flattened_predictions(shifted, labels, lengths=[3, 4, 2])
    padding = np.full_like(predictions[:1], -100)
    with pytest.raises(ValueError, match="row 2 of predictions is all padding"):
        split_flattened_predictions(
            np.concatenate([predictions, padding]), np.concatenate([labels, labels[:1] * 0 - 100]), lengths=[3, 4, 2]
        )
