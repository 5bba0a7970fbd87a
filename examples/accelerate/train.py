"""Train a tiny causal LM on a streamed, packed dataset with `accelerate launch` (DDP or FSDP), exact loss scaling.

    python examples/accelerate/train.py                                                    # one process, CPU
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate/train.py       # DDP on the CPU
    accelerate launch --config_file examples/accelerate/ddp.yaml examples/accelerate/train.py --output out/  # GPUs

Each rank packs its own share of the stream (`StreamingPacker` shards rows by index over ranks), so the DataLoader is
not passed through `accelerator.prepare`. Every optimizer step counts label tokens (or sequences) over all its
micro-batches on all ranks first, then each micro-batch's loss is divided by that one count: the step's gradient is
that of the global batch, however it was packed, accumulated or sharded. Ranks whose share of the stream runs out first
join the remaining steps with zero-loss micro-batches, so every example is trained on exactly once per epoch.

With `--output`, writes `result.pt` (rank 0): per step the global loss, the sorted example ids trained on, and the
synced gradients.
"""

import argparse
import contextlib
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker
from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import count_items, global_num_items, normalized_loss

# torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated: a warning at every loader that
# says nothing about this script. Silenced for that message from torchdata only.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", module=r"torchdata\.")

COLLATOR = DataCollatorWithFlattening()


def collate(packs: list[dict]) -> dict:
    """Flattening collator, keeping the example ids of the batch aside."""
    example_ids = [i for pack in packs for i in pack["example_ids"]]
    batch = COLLATOR([{k: v for k, v in pack.items() if k != "example_ids"} for pack in packs])
    return {**batch, "example_ids": example_ids}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="folder for result.pt (default: nothing written)")
    parser.add_argument("--num-examples", type=int, default=40)
    parser.add_argument("--pack-len", type=int, default=64)
    parser.add_argument("--packs-per-micro-batch", type=int, default=1)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--normalization", choices=["token", "sequence"], default="token")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="llama")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator()
    world_size = accelerator.num_processes
    rows = synthetic_rows(args.num_examples, seed=args.seed, max_len=args.pack_len)
    packer = StreamingPacker(
        rows, pack_len=args.pack_len, rank=accelerator.process_index, world_size=world_size, return_example_ids=True
    )
    loader = StatefulDataLoader(packer, batch_size=args.packs_per_micro_batch, collate_fn=collate)
    model = tiny_causal_lm(args.model, seed=args.seed, use_cache=False).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    mode = {"normalization": args.normalization}

    batches, steps = iter(loader), []
    while True:
        window = [b for _, b in zip(range(args.accumulation), batches, strict=False)]
        # Every rank must run as many backward passes as the rank with the most micro-batches left.
        num_micro = int(accelerator.reduce(torch.tensor(len(window)), reduction="max"))
        if num_micro == 0:
            break
        total = global_num_items(sum(int(count_items(b["labels"], seq_idx=b["seq_idx"], **mode)) for b in window))
        step_loss = torch.zeros(())
        for index in range(num_micro):
            sync = accelerator.no_sync(model) if index < num_micro - 1 else contextlib.nullcontext()
            with sync:
                if index < len(window):
                    batch = window[index]
                    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
                    loss = normalized_loss(
                        logits,
                        batch["labels"],
                        num_items_in_batch=total,
                        seq_idx=batch["seq_idx"],
                        world_size=world_size,
                        **mode,
                    )
                else:  # this rank's share ran out: join the collective with a zero-loss micro-batch
                    loss = model(input_ids=torch.zeros(1, 1, dtype=torch.long)).logits.sum() * 0.0
                accelerator.backward(loss)
                step_loss += loss.detach() / world_size
        seen = [i for b in window for i in b["example_ids"]]
        gathered = [None] * world_size
        if world_size > 1:
            torch.distributed.all_gather_object(gathered, seen)
        else:
            gathered = [seen]
        steps.append(
            {
                "loss": float(accelerator.reduce(step_loss, reduction="sum")),
                "example_ids": sorted(i for ids in gathered for i in ids),
                "grads": {n: p.grad.detach().clone() for n, p in accelerator.unwrap_model(model).named_parameters()},
            }
        )
        optimizer.step()
        optimizer.zero_grad()
        accelerator.print(f"step {len(steps)}: loss {steps[-1]['loss']:.6f}, {total} {args.normalization}s")

    if accelerator.is_main_process and args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        torch.save({"world_size": world_size, "steps": steps}, args.output / "result.pt")
    # Let gloo's worker threads release the last collectives' tensors while this thread waits without the GIL; the
    # DDP wrapper freed at return would otherwise join those threads holding the GIL and can deadlock at exit.
    accelerator.wait_for_everyone()
    del model, optimizer
    accelerator.end_training()


if __name__ == "__main__":
    main()
