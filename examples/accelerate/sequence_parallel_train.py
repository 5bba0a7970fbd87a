"""Train a tiny causal LM with sequence parallelism: every flattened row split over a group of processes.

    python examples/accelerate/sequence_parallel_train.py                     # one process: a group of one
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate/sequence_parallel_train.py   # gloo, CPU
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 4 examples/accelerate/sequence_parallel_train.py \\
        --sp-size 2                                               # 2 groups of 2: data parallel over the groups
    accelerate launch --multi_gpu --num_processes 8 examples/accelerate/sequence_parallel_train.py --sp-size 4

Processes form a `("dp", "sp")` mesh (`sequence_parallel_mesh`): the `sp_size` ranks of a group collate the same
examples into one flattened row and each keeps a contiguous slice of it (`DataCollatorForSequenceParallel`); groups
take different examples. The model is prepared with `prepare_model_for_sequence_parallel(model, mesh["sp"])` and
wrapped by accelerate (DDP over every process), so gradients are averaged over all `dp * sp` ranks: each rank's loss
is its summed token losses times `world_size / N`, `N` the step's label tokens over all ranks
(`sequence_parallel_loss`), and the averaged gradient is the gradient of the whole batch.

With `--output`, rank 0 writes `result.pt`: per step the examples of each group, the loss, the gradient of every
parameter, and the logits of group 0's row gathered from its ranks (padding removed).
"""

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator

from flatcollate.parallel import (
    DataCollatorForSequenceParallel,
    count_shifted_items,
    prepare_model_for_sequence_parallel,
    sequence_parallel_loss,
    sequence_parallel_mesh,
)
from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import global_num_items


def step_examples(step: int, group: int, *, num_groups: int, per_row: int, num_examples: int) -> list[int]:
    """Example ids that data-parallel group `group` flattens into its row at `step` (every rank of it the same)."""
    first = (step * num_groups + group) * per_row
    return [i % num_examples for i in range(first, first + per_row)]


def model_overrides(args: argparse.Namespace) -> dict:
    """Head counts of the tiny model: both must be multiples of the group size."""
    overrides = {"num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads}
    return {**overrides, "head_dim": 64 // args.heads}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="folder for result.pt")
    parser.add_argument("--sp-size", type=int, default=None, help="ranks per sequence-parallel group (default: all)")
    parser.add_argument("--num-examples", type=int, default=24)
    parser.add_argument("--examples-per-row", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--heads", type=int, default=4, help="query heads of the tiny model")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads of the tiny model")
    return parser.parse_args(argv)


def gathered_logits(logits: torch.Tensor, group: dist.ProcessGroup, size: int, tokens: int) -> torch.Tensor:
    """The whole row's logits `(1, tokens, V)` from every rank's slice, padding removed (on every rank)."""
    pieces = [torch.empty_like(logits) for _ in range(size)]
    dist.all_gather(pieces, logits.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=1)[:, :tokens]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    accelerator = Accelerator()
    alone = not dist.is_initialized()
    if alone:  # `python ...`: a gloo group of one process, so that the same code runs
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    world_size = accelerator.num_processes
    mesh = sequence_parallel_mesh(args.sp_size or world_size, device_type=accelerator.device.type)
    sp_size, sp_rank, group = mesh["sp"].size(), mesh["sp"].get_local_rank(), mesh["sp"].get_group()
    num_groups, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()

    model = tiny_causal_lm(args.model, seed=args.seed, use_cache=False, **model_overrides(args)).train()
    prepare_model_for_sequence_parallel(model, mesh["sp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)  # DDP over all processes: gradients averaged
    collator = DataCollatorForSequenceParallel(rank=sp_rank, world_size=sp_size)
    rows = synthetic_rows(args.num_examples, seed=args.seed, max_len=args.max_len)

    steps = []
    for step in range(args.steps):
        examples = step_examples(
            step, dp_rank, num_groups=num_groups, per_row=args.examples_per_row, num_examples=args.num_examples
        )
        batch = collator([rows[i] for i in examples])
        shift_labels = batch.pop("shift_labels")
        total = global_num_items(count_shifted_items(shift_labels))  # label tokens of every rank's slice
        logits = model(**batch).logits
        loss = sequence_parallel_loss(logits, shift_labels, num_items_in_batch=total, world_size=world_size)
        accelerator.backward(loss)
        tokens = sum(len(rows[i]["input_ids"]) for i in examples)
        record = {
            "examples": examples,
            "loss": float(accelerator.reduce(loss.detach(), reduction="sum")) / world_size,
            "logits": gathered_logits(logits, group, sp_size, tokens),
            "grads": {name: p.grad.detach().clone() for name, p in accelerator.unwrap_model(model).named_parameters()},
            "padded_tokens": batch["cu_seq_lens_q"][-1].item(),
        }
        steps.append(record)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.print(f"step {step}: loss {record['loss']:.6f}, {total} label tokens over {world_size} ranks")

    result = {"world_size": world_size, "sp_size": sp_size, "steps": steps}
    if accelerator.is_main_process and args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        torch.save(result, args.output / "result.pt")
    accelerator.wait_for_everyone()
    del model, optimizer
    accelerator.end_training()  # also ends the group of one
    return result


if __name__ == "__main__":
    main()
