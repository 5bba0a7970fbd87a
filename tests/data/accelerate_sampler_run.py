"""One process of `test_sampler_accelerate.py`'s two-process run: `TokenBudgetBatchSampler` under `accelerator.prepare`.

Launched by torchrun (gloo, CPU). Writes `rank<r>.json`: the batches this rank was given step by step over two epochs by
the supported setup (`shard=False`, accelerate deals the batches), and what the default sampler (which shards by rank
itself) did under `accelerator.prepare`: the indices it was given, or the error it raised. With `--stop-at N` it then
runs the resumable loop of docs/data.md, saves its state after step N to `step_N/` and stops (the batches it trained
are in `rank<r>.json`); with `--resume step_N/` (a new launch) it only goes on from that state, and writes the batches
it trained, or the error that refused the state, to `resumed_rank<r>.json`.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from accelerate import Accelerator
from torch.utils.data import DataLoader

from flatcollate.data.sampler import TokenBudgetBatchSampler

NUM_EXAMPLES, BATCH_SIZE, MAX_TOKENS, EPOCHS = 40, 2, 200, 2


def lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(1, 90, NUM_EXAMPLES)


def indices(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def train(accelerator: Accelerator, *, resume: Path | None = None, stop_at: int | None = None, output: Path):
    """The resumable loop of docs/data.md; returns the batches this rank trained on, step by step."""
    sampler = TokenBudgetBatchSampler(lengths(), batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS, shard=False)
    loader = accelerator.prepare(DataLoader(list(range(NUM_EXAMPLES)), batch_sampler=sampler, collate_fn=list))
    accelerator.register_for_checkpointing(sampler)
    step = 0
    if resume is not None:
        accelerator.load_state(resume)  # refuses another batch_size, max_tokens, world size, seed or dataset
        step = int(resume.name.removeprefix("step_"))
    trained = []
    start_epoch, steps_done = divmod(step, len(loader))
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        loader.set_epoch(epoch)
        skip = steps_done if epoch == start_epoch else 0  # steps of this epoch trained before the state was saved
        for batch in accelerator.skip_first_batches(loader, skip) if skip else loader:
            trained.append([int(i) for i in batch])  # the training step
            step += 1
            if step == stop_at:
                accelerator.save_state(output / f"step_{step}")
                return trained
    return trained


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--stop-at", type=int, help="also run the resumable loop and save its state after this step")
    parser.add_argument("--resume", type=Path, help="only go on from this saved state (a `step_<n>` folder)")
    args = parser.parse_args()
    accelerator = Accelerator()
    if args.resume is not None:
        out = args.output / f"resumed_rank{accelerator.process_index}.json"
        try:
            out.write_text(json.dumps({"trained": train(accelerator, resume=args.resume, output=args.output)}))
        except ValueError as error:
            out.write_text(json.dumps({"error": str(error)}))
        return
    result = {"rank": accelerator.process_index, "num_processes": accelerator.num_processes}

    default = TokenBudgetBatchSampler(lengths(), batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS)  # shards by rank
    loader = accelerator.prepare(DataLoader(list(range(NUM_EXAMPLES)), batch_sampler=default, collate_fn=list))
    try:
        result["default_seen"], result["default_error"] = indices(loader), None
    except ValueError as error:
        result["default_seen"], result["default_error"] = None, str(error)
    out = args.output / f"rank{accelerator.process_index}.json"
    out.write_text(json.dumps(result))  # before the supported setup, so a run that fails there still tells this part

    sampler = TokenBudgetBatchSampler(lengths(), batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS, shard=False)
    loader = accelerator.prepare(DataLoader(list(range(NUM_EXAMPLES)), batch_sampler=sampler, collate_fn=list))
    result["steps"], result["epochs"], result["batches"] = len(loader), [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # accelerate's `set_epoch` does not reach a batch sampler it wrapped
        batches = [[int(i) for i in batch] for batch in loader]
        result["epochs"].append([i for batch in batches for i in batch])
        result["batches"] += batches
    out.write_text(json.dumps(result))

    if args.stop_at is not None:
        result["stopped"] = train(accelerator, stop_at=args.stop_at, output=args.output)
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
