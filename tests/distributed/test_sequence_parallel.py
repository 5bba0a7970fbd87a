"""Sequence parallelism over 2 and 4 CPU processes (gloo) equals one process on the same flattened rows.

Each launched run trains a few SGD steps; one process then replays them on the unsplit rows with the packed backend
(`prepare_model_for_flattening`): logits (gathered from the ranks), loss and every parameter's gradient agree within
1e-5 at every step. The rows hold sequences that straddle rank slices, and lengths that are not a multiple of the
group size.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import count_items, normalized_loss

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "sequence_parallel_train.py"
_LAUNCH = Path(__file__).resolve().parents[1] / "training" / "launch.py"
_spec = importlib.util.spec_from_file_location("flatcollate_tests_launch", _LAUNCH)
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

pytestmark = [launch.needs_gloo, pytest.mark.slow]

STEPS, LR = 3, 0.1


def run(tmp_path: Path, processes: int, *args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
        "127.0.0.1", "--master_port", str(launch.free_port()), str(SCRIPT), "--output", str(tmp_path),
        "--steps", str(STEPS), "--lr", str(LR), *args,
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(
    ("processes", "heads"),
    [(2, ["--heads", "4", "--kv-heads", "2"]), (4, ["--heads", "8", "--kv-heads", "4"])],
    ids=["sp2-gqa4over2", "sp4-gqa8over4"],
)
def test_sequence_parallel_run_matches_one_process(tmp_path, processes, heads):
    done = run(tmp_path, processes, *heads)
    assert done.returncode == 0, done.stderr[-4000:]
    result = torch.load(tmp_path / "result.pt", weights_only=True)
    assert result["world_size"] == result["sp_size"] == processes
    script = launch.load_script(SCRIPT, "sequence_parallel_train_example")
    args = script.parse_args(heads)
    rows = synthetic_rows(args.num_examples, seed=args.seed, max_len=args.max_len)

    model = tiny_causal_lm(args.model, seed=args.seed, use_cache=False, **script.model_overrides(args)).train()
    model = prepare_model_for_flattening(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    collator = DataCollatorWithFlattening()
    straddling = unaligned = 0
    for number, step in enumerate(result["steps"]):
        lengths = [len(rows[i]["input_ids"]) for i in step["examples"]]
        bounds, local = np.cumsum([0, *lengths]), step["padded_tokens"] // processes
        straddling += int(((bounds[:-1] // local) != ((bounds[1:] - 1) // local)).sum())
        unaligned += bounds[-1] % processes != 0
        batch = collator([rows[i] for i in step["examples"]])
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        loss = normalized_loss(logits, batch["labels"], num_items_in_batch=count_items(batch["labels"]))
        loss.backward()
        torch.testing.assert_close(step["logits"], logits.detach(), atol=1e-5, rtol=0, msg=f"step {number} logits")
        assert abs(step["loss"] - float(loss.detach())) <= 1e-5, f"step {number}"
        for name, param in model.named_parameters():
            torch.testing.assert_close(step["grads"][name], param.grad, atol=1e-5, rtol=0, msg=f"step {number} {name}")
        optimizer.step()
        optimizer.zero_grad()
    assert straddling >= STEPS, "sequences cross slice edges"
    assert unaligned >= 1, "at least one row needed padding to a multiple of the group size"


def test_heads_that_do_not_split_over_the_group_are_refused(tmp_path):
    done = run(tmp_path, 2, "--heads", "4", "--kv-heads", "1")  # multi-query attention: 1 key/value head
    assert done.returncode != 0
    assert "has 4 query heads and 1 key/value heads, which do not split over a sequence-parallel group of 2" in (
        done.stderr
    )
