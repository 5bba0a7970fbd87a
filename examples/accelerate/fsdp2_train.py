"""Train a prepared tiny causal LM on flattened batches with FSDP2 or DDP, checkpointing mid-epoch and resuming exactly.

    python examples/accelerate/fsdp2_train.py                                                   # one process, CPU
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate/fsdp2_train.py      # FSDP2 on the CPU
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate/fsdp2_train.py --parallel ddp --data map
    # checkpoint every 2 steps; after a crash, the same command with --resume goes on from the newest full checkpoint
    python examples/accelerate/fsdp2_train.py --checkpoint-dir ckpt/ --checkpoint-every 2

With several processes and `--parallel fsdp2` (default) the model is sharded with FSDP2: `fully_shard` on every
decoder layer and then on the whole model, over gloo on the CPU. The script calls `fully_shard` itself because
accelerate's FSDP plugin does not apply on the CPU (accelerate keeps `MULTI_CPU` there and wraps the model in DDP; on
GPUs, `examples/accelerate/fsdp.yaml` selects the plugin). The model is prepared for flattened batches
(`flatcollate.prepare_model_for_flattening`) before it is sharded. Batches come from either:

- `--data stream`: a `StreamingPacker` per rank (it shards rows by index over ranks), micro-batches of packs;
- `--data map`: a list of rows batched by `TokenBudgetBatchSampler` (one balanced batch per rank per micro-batch).

Both go through a `StatefulDataLoader`. Each optimizer step counts label tokens over its micro-batches on all ranks
and divides every micro-batch's summed loss by that count (`normalized_loss`), accumulating with `no_sync`; ranks
whose data runs out join the remaining steps with zero-loss micro-batches (see `train.py`).

Checkpoints (`--checkpoint-dir`, every `--checkpoint-every` steps) are `accelerator.save_state` (RNG of every rank;
model and optimizer under DDP or one process), under FSDP2 the model and optimizer shards written by every rank with
`torch.distributed.checkpoint`, and each rank's own `loader_rank{r}.pt`: the DataLoader state differs per rank (each
rank packs its own share) and `accelerator.register_for_checkpointing` would keep rank 0's only. A checkpoint counts
once `complete` is written, after every rank has saved; `--resume` loads the newest complete one, so a job killed
while saving resumes from the one before.

With `--output`, rank 0 appends one JSON line per step to `steps.jsonl` (loss, example ids of each rank) as it goes,
and writes `result.pt` at the end: the steps of this run and the full (unsharded) parameters.
"""

import argparse
import contextlib
import gc
import json
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening, TokenBudgetBatchSampler, prepare_model_for_flattening
from flatcollate.streaming import StreamingPacker
from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import count_items, global_num_items, normalized_loss

# torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated: a warning at every loader that
# says nothing about this script. Silenced for that message from torchdata only.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", module=r"torchdata\.")

COLLATOR = DataCollatorWithFlattening()


def collate(items: list[dict]) -> dict:
    """Flattening collator over packs (`example_ids`) or rows (`example_id`), keeping the example ids aside."""
    ids = [i for item in items for i in item.get("example_ids", [item.get("example_id")])]
    batch = COLLATOR([{k: v for k, v in item.items() if k not in ("example_ids", "example_id")} for item in items])
    return {**batch, "example_ids": ids}


class IndexedRows(torch.utils.data.Dataset):
    """Map-style rows that also return their index as `example_id`."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {**self.rows[index], "example_id": index}


def make_loader(args: argparse.Namespace, rank: int, world_size: int) -> StatefulDataLoader:
    rows = synthetic_rows(args.num_examples, seed=args.seed, max_len=args.pack_len)
    if args.data == "stream":
        packer = StreamingPacker(
            rows, pack_len=args.pack_len, rank=rank, world_size=world_size, return_example_ids=True
        )
        return StatefulDataLoader(packer, batch_size=args.packs_per_micro_batch, collate_fn=collate)
    sampler = TokenBudgetBatchSampler(
        [len(row["input_ids"]) for row in rows],
        batch_size=args.rows_per_micro_batch,
        max_tokens=args.rows_per_micro_batch * args.pack_len,
        seed=args.seed,
        num_replicas=world_size,
        rank=rank,
    )
    return StatefulDataLoader(IndexedRows(rows), batch_sampler=sampler, collate_fn=collate)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="folder for steps.jsonl and result.pt")
    parser.add_argument("--parallel", choices=["fsdp2", "ddp"], default="fsdp2", help="with several processes")
    parser.add_argument("--data", choices=["stream", "map"], default="stream")
    parser.add_argument("--num-examples", type=int, default=40)
    parser.add_argument("--pack-len", type=int, default=64)
    parser.add_argument("--packs-per-micro-batch", type=int, default=1, help="--data stream")
    parser.add_argument("--rows-per-micro-batch", type=int, default=2, help="--data map")
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (optimizer state to checkpoint)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="optimizer steps; 0: never")
    parser.add_argument("--resume", action="store_true", help="go on from the newest complete checkpoint, if any")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (lets a test kill)")
    return parser.parse_args(argv)


def newest_checkpoint(folder: Path | None) -> Path | None:
    """The complete checkpoint of the highest step under `folder` (`step-<n>/complete` exists), or `None`."""
    if folder is None or not folder.is_dir():
        return None
    done = [path.parent for path in folder.glob("step-*/complete")]
    return max(done, key=lambda path: int(path.name.split("-")[1]), default=None)


def save_checkpoint(accelerator: Accelerator, model, optimizer, loader: StatefulDataLoader, path: Path) -> None:
    """Write checkpoint `path` (every rank takes part); it counts once `complete` is written beside it."""
    accelerator.save_state(str(path))  # RNG of every rank, and the model and optimizer that accelerate prepared
    if isinstance(model, FSDPModule):  # sharded: every rank writes its own shards
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path / "fsdp2")
    torch.save(loader.state_dict(), path / f"loader_rank{accelerator.process_index}.pt")


def load_checkpoint(accelerator: Accelerator, model, optimizer, loader: StatefulDataLoader, path: Path) -> int:
    """Restore what `save_checkpoint` wrote; returns the optimizer steps taken before it."""
    accelerator.load_state(str(path))
    if isinstance(model, FSDPModule):
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=path / "fsdp2")  # in place, into this rank's shards
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    loader.load_state_dict(torch.load(path / f"loader_rank{accelerator.process_index}.pt", weights_only=True))
    return int((path / "complete").read_text())


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered whole (FSDP2 holds `DTensor` shards), on every rank."""
    return {
        name: (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()
        for name, param in model.named_parameters()
    }


def shard_model(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """FSDP2: `fully_shard` every decoder layer (the model's `_no_split_modules`), then the whole model."""
    for module in model.modules():
        if type(module).__name__ in model._no_split_modules:
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


@contextlib.contextmanager
def no_sync(accelerator: Accelerator, model: torch.nn.Module):
    """Accumulate gradients without reducing them: `accelerator.no_sync`, or FSDP2's own switch."""
    if not isinstance(model, FSDPModule):
        with accelerator.no_sync(model):
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def train(args: argparse.Namespace, accelerator: Accelerator, mesh: DeviceMesh | None) -> dict:
    """The run: FSDP2 over `mesh`, or DDP (or one process) without one. Returns what `main` returns."""
    world_size, rank = accelerator.num_processes, accelerator.process_index
    loader = make_loader(args, rank, world_size)
    model = prepare_model_for_flattening(tiny_causal_lm(args.model, seed=args.seed, use_cache=False)).train()
    if mesh is not None:  # accelerate would wrap the model in DDP on the CPU (see docs/distributed.md): shard it here
        model = shard_model(model, mesh)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        model, optimizer = accelerator.prepare(model, optimizer)

    start = 0
    resume_from = newest_checkpoint(args.checkpoint_dir) if args.resume else None
    if resume_from is not None:
        start = load_checkpoint(accelerator, model, optimizer, loader, resume_from)
        accelerator.print(f"resumed from {resume_from} after step {start}")

    batches, steps, step = iter(loader), [], start
    log = None
    if accelerator.is_main_process and args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        log = (args.output / "steps.jsonl").open("a")
    while True:
        window = [b for _, b in zip(range(args.accumulation), batches, strict=False)]
        # Every rank must run as many forward and backward passes as the rank with the most micro-batches left.
        num_micro = int(accelerator.reduce(torch.tensor(len(window)), reduction="max"))
        if num_micro == 0:
            break
        total = global_num_items(sum(int(count_items(b["labels"])) for b in window))
        step_loss = torch.zeros(())
        for index in range(num_micro):
            sync = no_sync(accelerator, model) if index < num_micro - 1 else contextlib.nullcontext()
            with sync:
                if index < len(window):
                    batch = window[index]
                    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
                    loss = normalized_loss(logits, batch["labels"], num_items_in_batch=total, world_size=world_size)
                else:  # this rank's share ran out: join the collectives with a zero-loss micro-batch
                    loss = model(input_ids=torch.zeros(1, 1, dtype=torch.long)).logits.sum() * 0.0
                accelerator.backward(loss)
                step_loss += loss.detach() / world_size
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        seen = [[i for b in window for i in b["example_ids"]]]
        if world_size > 1:
            seen = [None] * world_size
            torch.distributed.all_gather_object(seen, [i for b in window for i in b["example_ids"]])
        steps.append({"step": step, "loss": float(accelerator.reduce(step_loss, reduction="sum")), "example_ids": seen})
        if log is not None:
            log.write(json.dumps(steps[-1]) + "\n")
            log.flush()
        accelerator.print(f"step {step}: loss {steps[-1]['loss']:.6f}, {total} tokens")
        if args.checkpoint_dir is not None and args.checkpoint_every and step % args.checkpoint_every == 0:
            path = args.checkpoint_dir / f"step-{step}"
            save_checkpoint(accelerator, model, optimizer, loader, path)
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:  # only now is the checkpoint whole
                (path / "complete").write_text(f"{step}\n")
        time.sleep(args.step_seconds)

    params = full_parameters(accelerator.unwrap_model(model))
    sharded = any(hasattr(param, "full_tensor") for param in model.parameters())
    result = {"world_size": world_size, "distributed_type": str(accelerator.distributed_type), "sharded": sharded}
    result["steps"] = steps
    if log is not None:
        log.close()
        torch.save({**result, "params": params}, args.output / "result.pt")
    return result


def end_training(accelerator: Accelerator, mesh: DeviceMesh | None) -> None:
    """Destroy the process group, its gloo threads joined, before the interpreter exits.

    A gloo worker thread frees a finished collective's tensors itself, taking the GIL for those Python owns. One still
    running when the interpreter finalizes is ended there inside a noexcept destructor: "terminate called without an
    active exception", SIGABRT at exit, now and then on a busy machine. Under FSDP2 `destroy_process_group` alone left
    the group running to the end: the mesh holds it (`_pg_registry`), DTensor's sharding caches hold the mesh for the
    life of the process, and FSDP2's modules hold it in reference cycles until a garbage collection.
    """
    accelerator.wait_for_everyone()  # every rank is done with the group
    if mesh is not None:
        gc.collect()  # the sharded model (freed when `train` returned) and its hooks form reference cycles
        mesh._pg_registry.clear()  # torch has no public way to let a mesh go of its groups
    accelerator.end_training()  # destroy_process_group now drops the group's last reference: its threads are joined


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    accelerator = Accelerator()
    mesh = None
    if args.parallel == "fsdp2" and accelerator.num_processes > 1:
        mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    result = train(args, accelerator, mesh)  # the model, its optimizer and autograd graph are freed at its return
    end_training(accelerator, mesh)
    return result


if __name__ == "__main__":
    main()
