"""One process of `test_sampler_accelerate.py`'s two-process run: `TokenBudgetBatchSampler` under `accelerator.prepare`.

Launched by torchrun (gloo, CPU). Writes `rank<r>.json`: the indices this rank was given per epoch by the supported
setup (`shard=False`, accelerate deals the batches), and what the default sampler (which shards by rank itself) did
under `accelerator.prepare`: the indices it was given, or the error it raised.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    accelerator = Accelerator()
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
    result["steps"], result["epochs"] = len(loader), []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # accelerate's `set_epoch` does not reach a batch sampler it wrapped
        result["epochs"].append(indices(loader))
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
