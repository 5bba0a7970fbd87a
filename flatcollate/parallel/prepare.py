"""`prepare_model_for_sequence_parallel`: a model prepared for flattened rows, whose rows are split over a group.

The model is first prepared as for one process (`prepare_model_for_flattening`: packed backend, guard), then switched
to the `flatcollate_sp` backend, and each attention layer is given the group it exchanges heads with. The guard then
reads batches as slices: `input_ids` and `position_ids` hold this rank's tokens, `cu_seq_lens_q/k` the whole row.
"""

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from transformers import PreTrainedModel

from ..boundaries import position_starts
from ..families import is_mixer
from ..modeling import prepare_model_for_flattening, unsupported_reason
from ..modeling.boundary_check import check_cu_seqlens, first_difference, refuse_other_starts, token_count
from ..modeling.composite import text_config_key
from ..modeling.prepared_state import Feature, FlatBatch, add_feature, mark_in_force
from ..modeling.support import takes_packed_backend
from .attention import (
    SP_CONTEXT_KEY,
    SequenceParallelContext,
    check_head_counts,
    register_sequence_parallel_attention,
)


def rank_slice(shard: tuple[int, int], model: torch.nn.Module, arguments: dict) -> FlatBatch:
    """The boundaries of slice `rank` of a row split into `size` equal slices (`shard`), what the guard of a
    sequence-parallel model runs with: the whole row's `cu_seq_lens_q/k`, checked against this rank's positions (or
    this rank's part of the row's positions, derived, when the batch has none).

    The slice's first token is a start in the slice's own positions; inside a sequence of the row it must continue
    that sequence instead: its position is at least its offset in the sequence (positions count up from a start of
    0 or more), which positions restarted per slice are not.
    """
    rank, size = shard
    rows, length, device = token_count(arguments)
    cu_given = arguments.get("cu_seq_lens_q") is not None or arguments.get("cu_seq_lens_k") is not None
    if rows != 1 or arguments.get("seq_idx") is not None or not cu_given:
        raise ValueError(
            f"A sequence-parallel batch is one row per rank with the whole row's `cu_seq_lens_q/k` and no `seq_idx`; "
            f"got {rows} rows{' and `seq_idx`' if arguments.get('seq_idx') is not None else ''}"
            f"{'' if cu_given else ' without `cu_seq_lens_q`'}. Split rows with "
            "`flatcollate.parallel.split_for_sequence_parallel`."
        )
    boundaries, _ = check_cu_seqlens(arguments, length, device, ranks=size)
    part = slice(rank * length, (rank + 1) * length)
    offsets, starts = boundaries.position_ids()[part], boundaries.starts[part]
    position_ids = arguments.get("position_ids")
    if position_ids is None:
        return FlatBatch(boundaries, offsets.reshape(1, length), derived=True, sliced=True)
    if position_ids.numel() != length:
        raise ValueError(
            f"`position_ids` of shape {tuple(position_ids.shape)} do not match this rank's {length} tokens; pass the "
            "positions of `split_for_sequence_parallel` (this rank's slice, shape (1, T / size))."
        )
    observed = position_starts(position_ids.to(device))
    observed[0] = starts[0] | (position_ids.reshape(-1)[0].to(device) < offsets[0])
    refuse_other_starts(int(first_difference(observed, starts)), starts, "cu_seq_lens_q")
    return FlatBatch(boundaries, position_ids, sliced=True)


def hand_group(context: SequenceParallelContext, model: torch.nn.Module, arguments: dict, flat: FlatBatch | None):
    """A `Feature`'s changes: every flattened forward hands its attention layers the group, as a keyword argument."""
    return {} if flat is None else {SP_CONTEXT_KEY: context}


def sequence_parallel_mesh(sp_size: int, *, device_type: str = "cpu") -> DeviceMesh:
    """A `("dp", "sp")` device mesh over every process: consecutive ranks form a sequence-parallel group.

    With 8 processes and `sp_size=4`: groups `[0 1 2 3]` and `[4 5 6 7]` split rows, and the two groups train on
    different rows (data parallelism over `mesh["dp"]`). Pass `mesh["sp"]` to `prepare_model_for_sequence_parallel`
    and `mesh["dp"].get_local_rank()` to the data loader as its rank.

    Args:
        sp_size (`int`): ranks per sequence-parallel group; must divide the world size.
        device_type (`str`): `"cpu"` (gloo) or `"cuda"` (nccl).
    """
    world = dist.get_world_size()
    if sp_size < 1 or world % sp_size:
        raise ValueError(
            f"`sp_size`={sp_size} must divide the number of processes ({world}); launch a multiple of it "
            "(e.g. `torchrun --nproc_per_node <dp * sp>`)."
        )
    return init_device_mesh(device_type, (world // sp_size, sp_size), mesh_dim_names=("dp", "sp"))


def _group_of(group: dist.ProcessGroup | DeviceMesh) -> dist.ProcessGroup:
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(
                f"Pass a 1-D device mesh (the sequence-parallel dimension, e.g. `mesh['sp']`), got one of "
                f"{group.ndim} dimensions {group.mesh_dim_names}."
            )
        return group.get_group()
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"`group` must be a torch.distributed ProcessGroup or a 1-D DeviceMesh, got {type(group).__name__}; "
            "e.g. `sequence_parallel_mesh(sp_size)['sp']`."
        )
    return group


def prepare_model_for_sequence_parallel(
    model: PreTrainedModel, group: dist.ProcessGroup | DeviceMesh
) -> PreTrainedModel:
    """Make `model` train rows split over `group` exactly as one process trains the whole row.

    Args:
        model (`PreTrainedModel`): a decoder-only causal LM (or a PEFT model wrapping one); modified in place.
        group (`ProcessGroup` or 1-D `DeviceMesh`): the sequence-parallel group; every rank of it must be given the
            same rows, split by `split_for_sequence_parallel` with this rank and size.

    Returns:
        The same model, prepared.

    Raises:
        `ValueError` when its query or key/value heads do not split over the group, or when its family cannot run
        the packed backend (its own backend kept, state-carrying layers, or not exact on flattened rows).
    """
    group = _group_of(group)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    base = model
    if not isinstance(model, PreTrainedModel) and callable(getattr(model, "get_base_model", None)):
        base = model.get_base_model()
    if not isinstance(base, PreTrainedModel):
        raise TypeError(f"Expected a transformers `PreTrainedModel` (or a PEFT model), got {type(model).__name__}.")
    config = base.config.get_text_config()
    model_type = getattr(config, "model_type", "")
    why = unsupported_reason(base)
    if why is None and text_config_key(base.config) is not None:
        why = (
            "it is an image-text model: an image's placeholder tokens would straddle the ranks' slices while its "
            "vision tower and 3-D positions need the whole example"
        )
    if why is None and not takes_packed_backend(base):
        why = "its attention layers do not dispatch through transformers' attention interface"
    if why is None and any(is_mixer(module) for module in base.modules()):
        why = "its state-carrying layers pass a state along the row, which a slice per rank would cut"
    if why is not None:
        raise ValueError(
            f"{type(base).__name__} ({model_type!r}) cannot train with sequence parallelism: {why}. Train it "
            "without sequence parallelism (`prepare_model_for_flattening`)."
        )
    query_heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or query_heads
    check_head_counts(query_heads, kv_heads, size, where=f"{type(base).__name__} ({model_type!r})")
    prepare_model_for_flattening(base)
    base.set_attn_implementation(register_sequence_parallel_attention())
    mark_in_force(base)
    context = SequenceParallelContext(group=group, rank=rank, size=size)
    add_feature(
        base,
        Feature(
            "sequence parallel",
            changes=functools.partial(hand_group, context),
            boundaries=functools.partial(rank_slice, (rank, size)),
        ),
    )
    return model
