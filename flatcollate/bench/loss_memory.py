"""`flatcollate bench --loss-memory`: the loss part of one training step at a large vocabulary, full logits against
the fused loss (`prepare_model_for_flattening(fused_loss=True)`'s chunked PyTorch path): peak memory and tokens/s.

The loss part is what runs from the final hidden states `(1, T, H)` to their gradient and the head's: the head, the
cross-entropy and their backward. `full` is the model's own path (logits `(1, T, V)`, transformers' `ForCausalLMLoss`,
the logits dropped before the backward as `Trainer.compute_loss` drops them); `fused` is `next_token_loss`. Each
(mode, repeat) runs in a fresh process, the modes taking turns: one warm-up step, then one measured step. Its peak is
the process's resident memory high-water mark (`VmHWM`) over the resident memory just before the step, both read
from `/proc/self/status` after `malloc_trim` and a reset of the mark (`flatcollate.bench.memory.PeakMemory`): every
byte torch allocated on the CPU during the step and touched, its temporaries included, as the operating system saw
it. Ratios are taken within each repeat; the table gives their median and the spread (min-max) over repeats.
"""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MODES = ("full", "fused")


@dataclass(frozen=True)
class LossMemoryConfig:
    """What one `--loss-memory` run measures.

    Args:
        tokens (`int`): tokens of the flattened row (`T`), cut into sequences of `sequence_length`.
        vocab_size (`int`): outputs of the head (`V`).
        hidden_size (`int`): width of the hidden states (`H`).
        sequence_length (`int`): each sequence's first label is -100, as the guard sets it.
        repeats (`int`): runs of each mode, each a fresh process.
        threads (`int`): torch threads of each run.
        seed (`int`): seeds the hidden states, the head and the labels.
    """

    tokens: int = 8192
    vocab_size: int = 131072
    hidden_size: int = 256
    sequence_length: int = 512
    repeats: int = 3
    threads: int = 2
    seed: int = 0


def loss_step(mode: str, hidden, head, labels) -> float:
    """One forward and backward of the loss part; returns the loss."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from ..modeling.chunked_loss import chunk_tokens
    from ..modeling.fused_loss import FusedLoss, next_token_loss

    vocab_size = head.out_features
    if mode == "full":
        loss = ForCausalLMLoss(head(hidden), labels, vocab_size)  # the logits live until the loss is built
    else:
        settings = FusedLoss("chunked", None, chunk_tokens(vocab_size), None)
        loss = next_token_loss(
            hidden, head, labels=labels, shift_labels=None, num_items_in_batch=None, settings=settings
        )
    loss.backward()
    assert hidden.grad is not None and head.weight.grad is not None
    return float(torch.as_tensor(loss).detach())


def measure(config: LossMemoryConfig, mode: str) -> dict:
    """In a worker process: one warm-up and one measured step of `mode`; its seconds and memory added."""
    import torch

    from .memory import PeakMemory

    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    hidden = torch.randn(1, config.tokens, config.hidden_size, requires_grad=True)
    labels = torch.randint(0, config.vocab_size, (1, config.tokens))
    labels[:, :: config.sequence_length] = -100  # each sequence's first label
    meter = PeakMemory(torch.device("cpu"))
    loss_step(mode, hidden, head, labels)  # warm-up: the gradients' own buffers exist from here on
    meter.reset()
    start = time.perf_counter()
    loss = loss_step(mode, hidden, head, labels)
    seconds = time.perf_counter() - start
    return {"mode": mode, "loss": loss, "step_s": seconds, "tokens_per_s": config.tokens / seconds, **meter.figures()}


def run(config: LossMemoryConfig, *, out_dir: str | Path | None = None) -> dict:
    """Every (mode, repeat) in a fresh process, the modes taking turns; prints and returns the table and ratios."""
    runs = {mode: [] for mode in MODES}
    for _ in range(config.repeats):
        for mode in MODES:
            payload = json.dumps({"config": asdict(config), "mode": mode})
            done = subprocess.run(
                [sys.executable, "-m", __name__, "--worker", payload], capture_output=True, text=True, check=True
            )
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = {"config": asdict(config), "runs": runs, **ratios(runs)}
    print(table(result))
    if out_dir is not None:
        path = Path(out_dir).expanduser() / "loss_memory.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    return result


def ratios(runs: dict[str, list[dict]]) -> dict:
    """Medians per mode, and the fused/full ratios of memory and tokens/s within each repeat (median, min, max)."""

    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    pairs = list(zip(runs["full"], runs["fused"], strict=True))
    memory = [fused["added_memory_bytes"] / full["added_memory_bytes"] for full, fused in pairs]
    speed = [fused["tokens_per_s"] / full["tokens_per_s"] for full, fused in pairs]
    medians = {
        mode: {key: statistics.median(run[key] for run in runs[mode]) for key in ("added_memory_bytes", "tokens_per_s")}
        for mode in MODES
    }
    return {"medians": medians, "memory_ratio": spread(memory), "tokens_per_s_ratio": spread(speed)}


def table(result: dict) -> str:
    """The result as a markdown table, ratios last."""
    config, medians = result["config"], result["medians"]
    lines = [
        f"Loss part of one step: {config['tokens']} tokens x {config['vocab_size']} vocabulary, hidden "
        f"{config['hidden_size']}, fp32, CPU, {config['threads']} threads, {config['repeats']} repeats (median)",
        "",
        "| mode | peak memory added (MiB) | tokens/s |",
        "|---|---:|---:|",
    ]
    for mode in MODES:
        figures = medians[mode]
        lines.append(f"| {mode} | {figures['added_memory_bytes'] / 2**20:,.0f} | {figures['tokens_per_s']:,.0f} |")
    memory, speed = result["memory_ratio"], result["tokens_per_s_ratio"]
    lines += [
        "",
        f"fused / full memory: {memory['median']:.3f} (1/{1 / memory['median']:.1f}; "
        f"{memory['min']:.3f}-{memory['max']:.3f})",
        f"fused / full tokens/s: {speed['median']:.3f} ({speed['min']:.3f}-{speed['max']:.3f})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--worker":
        raise SystemExit("flatcollate.bench.loss_memory: expected --worker '<payload>' (started by flatcollate bench)")
    payload = json.loads(argv[1])
    print(json.dumps(measure(LossMemoryConfig(**payload["config"]), payload["mode"])))


if __name__ == "__main__":
    main()
