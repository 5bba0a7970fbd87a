"""`flatcollate bench --loss-memory`: the loss part of one step, full logits against the fused loss, each run a fresh
process; the command prints both modes and their ratios side by side and writes them as JSON. The figures are
measured, never asserted here (docs/loss.md gives them)."""

import json

import pytest

from flatcollate.bench import loss_memory
from flatcollate.cli import main


def test_the_command_prints_both_modes_and_their_ratios(tmp_path, capsys):
    assert main(["bench", "--loss-memory", "64", "512", "--repeats", "1", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| full |" in printed and "| fused |" in printed
    assert "fused / full memory:" in printed and "fused / full tokens/s:" in printed
    result = json.loads((tmp_path / "loss_memory.json").read_text())
    assert result["config"]["tokens"] == 64 and result["config"]["vocab_size"] == 512
    full, fused = result["runs"]["full"][0], result["runs"]["fused"][0]
    assert full["loss"] == pytest.approx(fused["loss"], rel=1e-6)  # the same loss, two ways


def test_more_than_tokens_and_vocab_is_a_usage_error(tmp_path, capsys):
    assert main(["bench", "--loss-memory", "64", "512", "3", "--out-dir", str(tmp_path)]) == 2
    assert "--loss-memory takes at most TOKENS and VOCAB, got [64, 512, 3]" in capsys.readouterr().err


def test_each_step_leaves_the_gradients_of_the_hidden_states_and_the_head():
    import torch

    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(1, 12, 8, requires_grad=True)
    labels = torch.randint(0, 50, (1, 12))
    losses = {mode: loss_memory.loss_step(mode, hidden, head, labels) for mode in loss_memory.MODES}
    assert losses["full"] == pytest.approx(losses["fused"], rel=1e-6)
