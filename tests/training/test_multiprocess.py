"""Two CPU processes (gloo, launched by torchrun) train the same steps as one process on the same global batches."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm

from .launch import free_port, needs_gloo
from .launch import load_script as load_script_at

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "train.py"
NUM_EXAMPLES, PACK_LEN, LR = 30, 48, 0.1

pytestmark = [needs_gloo, pytest.mark.slow]


def load_script():
    return load_script_at(SCRIPT, "accelerate_train_example")


def test_two_process_run_matches_single_process_reference(tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(SCRIPT), "--output", str(tmp_path), "--num-examples", str(NUM_EXAMPLES), "--pack-len", str(PACK_LEN),
        "--accumulation", "2", "--lr", str(LR),
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    result = torch.load(tmp_path / "result.pt", weights_only=True)
    assert result["world_size"] == 2
    steps = result["steps"]
    seen = [i for step in steps for i in step["example_ids"]]
    assert sorted(seen) == list(range(NUM_EXAMPLES)), "every example exactly once per epoch"

    rows = synthetic_rows(NUM_EXAMPLES, seed=0, max_len=PACK_LEN)
    model = tiny_causal_lm("llama", seed=0, use_cache=False).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for number, step in enumerate(steps):
        optimizer.zero_grad()
        loss_sum, tokens = torch.zeros(()), 0
        for index in step["example_ids"]:  # one sequence at a time, no packing, no sharding
            ids, labels = torch.tensor([rows[index]["input_ids"]]), torch.tensor(rows[index]["labels"])
            targets = labels[1:]
            keep = targets != -100
            logits = model(input_ids=ids).logits[0, :-1]
            loss_sum = loss_sum + torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
            tokens += int(keep.sum())
        loss = loss_sum / tokens
        loss.backward()
        assert abs(float(loss.detach()) - step["loss"]) <= 1e-5, f"step {number}"
        for name, param in model.named_parameters():
            torch.testing.assert_close(step["grads"][name], param.grad, atol=1e-5, rtol=0, msg=f"step {number} {name}")
        optimizer.step()
