"""FSDP2 (`fully_shard`) over two CPU processes trains a prepared model exactly like one process on the same batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flatcollate import prepare_model_for_flattening
from flatcollate.synthetic import synthetic_rows
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import count_items, normalized_loss

from .launch import free_port, needs_gloo
from .launch import load_script as load_script_at

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "fsdp2_train.py"
NUM_EXAMPLES, PACK_LEN, LR, MOMENTUM = 30, 48, 0.1, 0.9

pytestmark = [needs_gloo, pytest.mark.slow]


def load_script():
    return load_script_at(SCRIPT, "accelerate_fsdp2_example")


def run_two_processes(output: Path, *args: str) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(SCRIPT), "--output", str(output), "--num-examples", str(NUM_EXAMPLES),
        "--pack-len", str(PACK_LEN), "--accumulation", "2", "--lr", str(LR), "--momentum", str(MOMENTUM),
        *args,
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(output / "result.pt", weights_only=True)


@pytest.mark.parametrize("data", ["stream", "map"])
def test_fsdp2_two_processes_match_one_process_on_the_same_global_batches(tmp_path, data):
    result = run_two_processes(tmp_path, "--parallel", "fsdp2", "--data", data)
    assert result["world_size"] == 2
    assert result["sharded"], "the parameters were DTensor shards (fully_shard), not DDP replicas"
    steps = result["steps"]
    assert len(steps) >= 3
    assert all(len(step["example_ids"]) == 2 for step in steps)
    assert all(step["example_ids"][1] for step in steps[:2]), "rank 1 trained on examples of its own"
    seen = [i for step in steps for ids in step["example_ids"] for i in ids]
    assert sorted(seen) == list(range(NUM_EXAMPLES)), "every example exactly once per epoch"

    # One process: every step's examples (both ranks' micro-batches) flattened into one row, one backward.
    script = load_script()
    rows = synthetic_rows(NUM_EXAMPLES, seed=0, max_len=PACK_LEN)
    model = prepare_model_for_flattening(tiny_causal_lm("llama", seed=0, use_cache=False)).train()
    initial = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for number, step in enumerate(steps):
        batch = script.collate([{**rows[i], "example_id": i} for ids in step["example_ids"] for i in ids])
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        loss = normalized_loss(logits, batch["labels"], num_items_in_batch=count_items(batch["labels"]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert abs(float(loss.detach()) - step["loss"]) <= 1e-5, f"step {number}"

    params = result["params"]
    assert params.keys() == initial.keys()
    for name, param in model.named_parameters():
        assert params[name].shape == param.shape, name
        torch.testing.assert_close(params[name], param.detach(), atol=1e-5, rtol=0, msg=f"{name} after training")
    moved = max(float((param.detach() - initial[name]).abs().max()) for name, param in model.named_parameters())
    assert moved > 1e-3, "training changed the parameters by more than the tolerance"


PLUGIN_PROBE = """
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from flatcollate.testing import tiny_causal_lm

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
model = tiny_causal_lm("llama")
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
if accelerator.is_main_process:
    sharded = any(hasattr(param, "full_tensor") for param in model.parameters())
    print(f"{accelerator.distributed_type.value} {type(model).__name__} sharded={sharded}")
accelerator.wait_for_everyone()
del model, optimizer
accelerator.end_training()
"""


def test_accelerate_fsdp_plugin_falls_back_to_ddp_on_the_cpu(tmp_path):
    """Why the example calls `fully_shard` itself: on the CPU accelerate ignores the plugin (red once it does not)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PLUGIN_PROBE)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(probe),
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "MULTI_CPU DistributedDataParallel sharded=False" in done.stdout


THREADS_PROBE = """
import collections, importlib.util, json, os, sys
from pathlib import Path
import torch

def native_threads():  # thread names (comm) of this process, gloo's C++ threads included
    return collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

spec = importlib.util.spec_from_file_location("accelerate_fsdp2_example", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
seen = {}
destroy = torch.distributed.destroy_process_group

def destroy_process_group(*args, **kwargs):
    seen["at_destroy"] = native_threads()
    destroy(*args, **kwargs)

torch.distributed.destroy_process_group = destroy_process_group
script.main(sys.argv[3:])
report = {**seen, "after_main": native_threads()}
(Path(sys.argv[2]) / f"threads_rank{os.environ['RANK']}.json").write_text(json.dumps(report))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
def test_fsdp2_run_joins_the_gloo_threads_before_the_interpreter_exits(tmp_path):
    """Gloo's worker threads still running at interpreter exit can abort it ("terminate called without an active
    exception"): under FSDP2 the mesh and DTensor's caches kept the group alive past `destroy_process_group`."""
    probe = tmp_path / "probe.py"
    probe.write_text(THREADS_PROBE)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(probe), str(SCRIPT), str(tmp_path), "--parallel", "fsdp2",
        "--num-examples", "12", "--pack-len", str(PACK_LEN), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--checkpoint-every", "1",
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "terminate called" not in done.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"threads_rank{rank}.json").read_text())
        assert [name for name in report["at_destroy"] if "gloo" in name], f"rank {rank}: gloo's threads (named so) ran"
        left = {name: n for name, n in report["after_main"].items() if "gloo" in name}
        assert not left, f"rank {rank}: gloo threads still running after main returned: {left}"
