"""The label rule follows the model's head, and heads that cannot be exact on a flattened row are refused.

- Causal LMs shift labels inside the model, so the collator masks each sequence's first label (`separator_id=-100`).
- Token-classification heads label each token in place: `separator_id=None` keeps every label, and a flattened batch
  through a prepared model equals each sequence alone.
- Sequence-classification, question-answering and multiple-choice heads read one position per row; a flattened row of
  N sequences would get one answer, so `prepare_model_for_flattening` refuses them.
- Encoder-only models (bidirectional attention) are refused at `prepare`, naming the reason.
"""

import itertools

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_config

LENGTHS = [5, 1, 8, 3]
NUM_LABELS = 3


def token_features() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(3, 256, (n,), generator=generator).tolist(),
            "labels": torch.randint(0, NUM_LABELS, (n,), generator=generator).tolist(),
        }
        for n in LENGTHS
    ]


def token_classifier(family: str):
    torch.manual_seed(0)
    config = tiny_config(family, num_labels=NUM_LABELS)
    return AutoModelForTokenClassification.from_config(config).eval()


def per_sequence_loss(model, features) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: each sequence alone, all of its labels, loss averaged over every labelled token of the batch."""
    logits, total = [], 0.0
    for feature in features:
        out = model(input_ids=torch.tensor([feature["input_ids"]]))
        total = total + torch.nn.functional.cross_entropy(
            out.logits[0], torch.tensor(feature["labels"]), reduction="sum"
        )
        logits.append(out.logits)
    return torch.cat(logits, 1), total / sum(LENGTHS)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_token_classification_keeps_every_label_and_is_exact(family):
    model = prepare_model_for_flattening(token_classifier(family))
    features = token_features()
    batch = DataCollatorWithFlattening(separator_id=None)(features)
    assert batch["labels"][0].tolist() == list(itertools.chain.from_iterable(f["labels"] for f in features))
    out = model(**batch)
    ref_logits, ref_loss = per_sequence_loss(model, features)
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, ref_loss, atol=1e-5, rtol=0)


def test_causal_label_rule_on_a_token_classifier_warns_that_labels_are_lost():
    """Negative control: the causal rule (the default) masks 4 of the 17 real labels; the loss differs and the
    prepared model says why."""
    model = prepare_model_for_flattening(token_classifier("llama"))
    features = token_features()
    batch = DataCollatorWithFlattening()(features)
    with pytest.warns(UserWarning, match=r"(?s)first label of every sequence.*separator_id=None"):
        out = model(**batch)
    assert (out.loss - per_sequence_loss(model, features)[1]).abs() > 1e-4


def test_causal_lm_still_masks_the_first_label():
    batch = DataCollatorWithFlattening()(token_features())
    starts = batch["cu_seq_lens_q"][:-1].long()
    assert (batch["labels"][0, starts] == -100).all()


@pytest.mark.parametrize(
    "auto_class", [AutoModelForSequenceClassification, AutoModelForQuestionAnswering], ids=["sequence", "qa"]
)
def test_heads_that_read_one_position_per_row_are_refused(auto_class):
    torch.manual_seed(0)
    config = tiny_config("llama", num_labels=2, pad_token_id=0)
    model = auto_class.from_config(config).eval()
    with pytest.raises(ValueError, match=r"(?s)For(SequenceClassification|QuestionAnswering).*per row.*padded"):
        prepare_model_for_flattening(model)


def test_sequence_classification_prepared_leniently_refuses_flattened_batches():
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny_config("llama", num_labels=2, pad_token_id=0))
    with pytest.warns(UserWarning, match="per row"):
        model = prepare_model_for_flattening(model, strict=False)
    batch = DataCollatorWithFlattening()(token_features())
    batch.pop("labels")
    with pytest.raises(ValueError, match=r"(?s)flattened batch.*per row"):
        model(**batch)
    padded = torch.randint(3, 256, (2, 6))
    assert model(input_ids=padded).logits.shape == (2, 2)  # padded batches still run


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert", "distilbert"])
def test_encoder_only_models_are_refused_at_prepare(family):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config(family, is_decoder=False)).eval()
    with pytest.raises(ValueError, match=r"(?s)both ways.*encoder"):
        prepare_model_for_flattening(model)
