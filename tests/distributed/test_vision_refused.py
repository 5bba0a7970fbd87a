"""Sequence parallelism slices the text row; a vision-language model's images would straddle the slices, so it is
refused before anything is changed."""

import pytest
import torch.distributed as dist

from flatcollate import prepare_model_for_sequence_parallel
from flatcollate.models.vision import tiny_vision_lm

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs the gloo backend")


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@needs_gloo
def test_a_vision_language_model_is_refused(group_of_one):
    model = tiny_vision_lm("qwen2_vl")
    before = model.config.get_text_config()._attn_implementation
    with pytest.raises(ValueError, match="cannot train with sequence parallelism: it is an image-text model"):
        prepare_model_for_sequence_parallel(model, group_of_one)
    assert model.config.get_text_config()._attn_implementation == before
