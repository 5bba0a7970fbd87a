"""Families that size a buffer by the config (ALiBi bias, local-attention bias, position tables) and a flattened row
longer than it: a clear error naming the setting, never a raw shape error; rows within it stay exact."""

import pytest

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.check import check_model
from flatcollate.testing import tiny_causal_lm

LIMITED = {
    "mpt": "max_seq_len",
    "gpt_neo": "max_position_embeddings",
    "big_bird": "max_position_embeddings",
    "roformer": "max_position_embeddings",
}


@pytest.mark.parametrize("family", sorted(LIMITED))
def test_a_row_over_the_configured_length_is_refused_with_the_setting_named(family):
    key = LIMITED[family]
    model = prepare_model_for_flattening(tiny_causal_lm(family, **{key: 64}))
    batch = DataCollatorWithFlattening()([{"input_ids": list(range(1, 41))}, {"input_ids": list(range(2, 42))}])
    with pytest.raises(ValueError, match=rf"(?s)`config.{key}`=64.*80 tokens.*max_tokens=64"):
        model(**batch)


@pytest.mark.parametrize("family", sorted(LIMITED))
def test_rows_within_the_configured_length_are_exact(family):
    key = LIMITED[family]
    report = check_model(family, backends=("flatcollate",), lengths=(40, 1, 23), overrides={key: 64})
    assert report.passed, report.to_markdown()
