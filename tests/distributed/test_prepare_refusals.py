"""`prepare_model_for_sequence_parallel` and `sequence_parallel_mesh` refuse what they cannot run exactly, naming the
model, the family's reason (an image-text model's too) or the argument and the fix, before anything is changed; each
refusal has the accepted call beside it as its control."""

import re

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from flatcollate.parallel import prepare_model_for_sequence_parallel, sequence_parallel_mesh
from flatcollate.testing import tiny_causal_lm
from flatcollate.testing.tiny_vision import tiny_vision_lm

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs the gloo backend")


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_llama_is_prepared_and_a_peft_model_through_its_base(group_of_one):
    model = prepare_model_for_sequence_parallel(tiny_causal_lm("llama"), group_of_one)
    assert model.config._attn_implementation == "flatcollate_sp"
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(tiny_causal_lm("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert prepare_model_for_sequence_parallel(wrapped, group_of_one) is wrapped
    assert wrapped.get_base_model().config._attn_implementation == "flatcollate_sp"


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("recurrent_gemma", "its recurrent layers carry state across sequence boundaries"),
        ("doge", "its attention layers do not dispatch through transformers' attention interface"),
        ("jamba", "its state-carrying layers pass a state along the row, which a slice per rank would cut"),
    ],
)
def test_a_family_that_cannot_be_split_is_refused_unchanged(group_of_one, family, reason):
    model = tiny_causal_lm(family)
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match=f"\\({family!r}\\) cannot train with sequence parallelism: {reason}"):
        prepare_model_for_sequence_parallel(model, group_of_one)
    assert model.config._attn_implementation == before


def test_a_vision_language_model_is_refused_unchanged(group_of_one):
    """Sequence parallelism slices the text row; an image's placeholder tokens would straddle the slices."""
    model = tiny_vision_lm("qwen2_vl")
    before = model.config.get_text_config()._attn_implementation
    with pytest.raises(ValueError, match="cannot train with sequence parallelism: it is an image-text model"):
        prepare_model_for_sequence_parallel(model, group_of_one)
    assert model.config.get_text_config()._attn_implementation == before


def test_what_is_not_a_model_or_a_group_is_refused_naming_its_type(group_of_one):
    not_a_model = "Expected a transformers `PreTrainedModel` (or a PEFT model), got dict"
    with pytest.raises(TypeError, match=re.escape(not_a_model)):
        prepare_model_for_sequence_parallel({}, group_of_one)
    not_a_group = "`group` must be a torch.distributed ProcessGroup or a 1-D DeviceMesh, got int"
    with pytest.raises(TypeError, match=re.escape(not_a_group)):
        prepare_model_for_sequence_parallel(tiny_causal_lm("llama"), 0)


def test_a_mesh_must_be_the_sequence_parallel_dimension(group_of_one):
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "sp"))
    with pytest.raises(ValueError, match=r"Pass a 1-D device mesh .* got one of 2 dimensions \('dp', 'sp'\)"):
        prepare_model_for_sequence_parallel(tiny_causal_lm("llama"), mesh)
    model = prepare_model_for_sequence_parallel(tiny_causal_lm("llama"), mesh["sp"])  # the control
    assert model.config._attn_implementation == "flatcollate_sp"


@pytest.mark.parametrize("sp_size", [0, 2])
def test_a_group_size_that_does_not_divide_the_processes_is_refused(group_of_one, sp_size):
    with pytest.raises(ValueError, match=f"`sp_size`={sp_size} must divide the number of processes \\(1\\)"):
        sequence_parallel_mesh(sp_size)
    assert sequence_parallel_mesh(1).mesh_dim_names == ("dp", "sp")
