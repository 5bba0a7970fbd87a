"""Errors of the encoders name their fix: a row error says how to skip such rows, an unknown option the right one."""

import pytest

from flatcollate.data import build_encoder
from flatcollate.data.row_errors import RowError
from flatcollate.synthetic import offline_tokenizer


def test_a_row_error_names_on_error_skip():
    encoder = build_encoder(offline_tokenizer(), format="instruction")
    with pytest.raises(RowError, match=r"row 0: field 'response' is empty\. .*on_error=\"skip\""):
        encoder({"query": "2 + 2?", "response": ""}, 0)


def test_dart_maths_prompt_template_is_pointed_to_template():
    with pytest.raises(TypeError, match=r"Did you mean template= for prompt_template="):
        build_encoder(offline_tokenizer(), prompt_template="alpaca")
    with pytest.raises(TypeError, match=r"Did you mean query_field= for query_fiel="):
        build_encoder(offline_tokenizer(), query_fiel="q")
