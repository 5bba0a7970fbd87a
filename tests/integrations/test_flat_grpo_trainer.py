"""`FlatGRPOTrainer`: GRPO's log-prob passes on flattened rows equal each sequence alone and `GRPOTrainer`'s own
per-token log-probabilities on the same completions; one optimizer step equals `GRPOTrainer`'s (same generations,
same seed): loss, metrics and parameters within 1e-5, fp32 CPU."""

import copy
import json
import tempfile

import pytest
import torch
from datasets import Dataset

from flatcollate import prepare_model_for_flattening
from flatcollate.integrations.trl.grpo import CompletionRows
from flatcollate.synthetic import offline_tokenizer
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
TOL = 1e-5


def padded_batch(seed: int = 0):
    """Four prompts of 2-6 tokens left-padded, completions of 1-5 tokens right-padded (0 = padding)."""
    generator = torch.Generator().manual_seed(seed)
    prompts, completions = [2, 6, 3, 5], [5, 1, 4, 3]
    width_p, width_c = max(prompts), max(completions)
    ids = torch.randint(1, 200, (4, width_p + width_c), generator=generator)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        mask[row, width_p - p : width_p + c] = 1
    return ids.masked_fill(mask == 0, 0), mask, width_c


def alone(model, ids, mask, width):
    """Reference: each row's real tokens alone; the log-prob of each completion token, in the `(B, K)` layout."""
    out = torch.zeros(ids.shape[0], width)
    for row in range(ids.shape[0]):
        real = ids[row][mask[row].bool()]
        logps = torch.log_softmax(model(input_ids=real[None]).logits[0], dim=-1)
        completion = int(mask[row, -width:].sum())
        for j in range(completion):
            token = len(real) - completion + j
            out[row, j] = logps[token - 1, real[token]]
    return out


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_flattened_pass_equals_each_sequence_alone_and_the_padded_pass(model_type):
    """GPT-2 learns absolute positions: `GRPOTrainer`'s padded pass numbers them from the left padding (a prompt
    padded by 4 starts at position 4), so its log-probabilities differ from each row alone, and `FlatGRPOTrainer`'s
    step from `GRPOTrainer`'s; the flattened pass numbers every sequence from 0, as alone, for every family."""
    model = tiny_causal_lm(model_type, seed=0, vocab_size=256)
    ids, mask, width = padded_batch()
    reference = alone(model, ids, mask, width)
    with torch.no_grad():
        padded, flat = _padded_pass(model, ids, mask, width), _flat_pass(model, ids, mask, width)
    torch.testing.assert_close(flat, reference, rtol=0, atol=TOL)
    gap = (padded * mask[:, -width:] - reference).abs().max().item()
    if model_type == "gpt2":
        assert gap > 1e-2, f"GRPOTrainer's padded pass was expected to differ for learned positions, gap {gap}"
    else:
        assert gap <= TOL


def _padded_pass(model, ids, mask, width):
    """`GRPOTrainer`'s own per-token log-probabilities of the completions, on a copy of `model`."""
    with tempfile.TemporaryDirectory() as tmp:
        args = trl.GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=4,
            num_generations=4,
            report_to=[],
            use_cpu=True,
            bf16=False,
            max_completion_length=4,
        )
        trainer = trl.GRPOTrainer(
            model=copy.deepcopy(model),
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "t1 t2"}] * 4),
            processing_class=offline_tokenizer(),
        )
        padded, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width)
    return padded


def _flat_pass(model, ids, mask, width):
    from trl.trainer.utils import add_fused_lm_head

    model = copy.deepcopy(model)
    add_fused_lm_head(model)
    prepare_model_for_flattening(model)
    rows = CompletionRows(mask, width)
    assert rows.flattenable
    out = model(**rows.model_inputs(ids), shift_labels=rows.shift_labels(ids), fused_lm_head=True, use_cache=False)
    return rows.completion_view(out.log_probs)


def test_rows_that_are_not_one_run_are_not_flattened():
    _, mask, width = padded_batch()
    mask[1, -1] = 1  # a token after the second completion's padding
    assert not CompletionRows(mask, width).flattenable


def one_step(trainer_class, tmp, tokenizer=None, prompts=None, **options):
    tokenizer = offline_tokenizer() if tokenizer is None else tokenizer
    model = f"{tmp}/model"  # by path: GRPOTrainer loads the reference model (beta > 0) from it
    tiny_causal_lm("llama", vocab_size=len(tokenizer), seed=0).save_pretrained(model)
    prompts = prompts or [" ".join(f"t{i}" for i in range(k, k + 2 + k % 5)) for k in range(8)]
    prompts = Dataset.from_list([{"prompt": prompt} for prompt in prompts])
    options = {"num_generations": 4, **options}
    args = trl.GRPOConfig(
        output_dir=tmp,
        per_device_train_batch_size=4,
        max_completion_length=6,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        **options,
    )

    def reward(completions, **_):
        return [float(len(c.split())) + 0.1 * (hash(c) % 7) for c in completions]

    trainer = trainer_class(
        model=model, reward_funcs=reward, args=args, train_dataset=prompts, processing_class=tokenizer
    )
    result = trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return params, result.training_loss, trainer.state.log_history[0]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"beta": 0.1},
        {"beta": 0.1, "steps_per_generation": 2},
        {"cache_implementation": "static", "num_generations": 2},
    ],
    ids=["policy", "reference", "old_policy", "static_cache"],
)
def test_one_step_equals_grpo_trainer(options):
    """With `cache_implementation="static"` the completions of two prompts of different lengths per batch are
    generated with a static cache: left-padded prompts numbered from their first real token and a 4-D mask, which
    the prepared policy runs as the unprepared one does."""
    from flatcollate.integrations.trl import FlatGRPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        expected, expected_loss, expected_logs = one_step(trl.GRPOTrainer, tmp, **options)
        got, loss, logs = one_step(FlatGRPOTrainer, tmp, **options)
    assert abs(loss - expected_loss) <= TOL
    for key in ("reward", "kl", "entropy", "clip_ratio/region_mean", "completions/mean_length"):
        if key in expected_logs:
            assert abs(logs[key] - expected_logs[key]) <= TOL, (key, logs[key], expected_logs[key])
    assert max((expected[n] - p).abs().max().item() for n, p in got.items()) <= TOL


def test_training_runs_the_flattened_pass_and_a_shifted_layout_is_caught(monkeypatch):
    """Every log-prob pass of a training step flattens its rows; reading each token's log-probability one position
    early (the control) moves the parameters after the step."""
    from flatcollate.integrations.trl import FlatGRPOTrainer

    seen = []
    init, view = CompletionRows.__init__, CompletionRows.completion_view

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.flattenable)

    monkeypatch.setattr(CompletionRows, "__init__", spy)
    with tempfile.TemporaryDirectory() as tmp:
        expected, _, _ = one_step(trl.GRPOTrainer, tmp, beta=0.1)
        got, _, _ = one_step(FlatGRPOTrainer, tmp, beta=0.1)
        assert seen and all(seen), seen
        # each completion token read one position early: the classic off-by-one of a shift over the row
        monkeypatch.setattr(CompletionRows, "completion_view", lambda self, flat: view(self, torch.roll(flat, 1, 1)))
        shifted, _, _ = one_step(FlatGRPOTrainer, tmp, beta=0.1)
    assert max((expected[n] - p).abs().max().item() for n, p in got.items()) <= TOL
    assert max((expected[n] - p).abs().max().item() for n, p in shifted.items()) > 1e-3


def test_one_step_equals_grpo_trainer_with_a_real_tokenizer(tokenizer_dir, shared_data):
    """Qwen2.5's tokenizer, GSM8K questions as prompts (left-padded to the longest), a reference model."""
    from transformers import AutoTokenizer

    from flatcollate.integrations.trl import FlatGRPOTrainer

    qwen = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    lines = (shared_data / "datasets" / "gsm8k_train.jsonl").read_text().splitlines()[:8]
    questions = [json.loads(line)["question"] for line in lines]
    with tempfile.TemporaryDirectory() as tmp:
        expected, expected_loss, expected_logs = one_step(trl.GRPOTrainer, tmp, qwen, questions, beta=0.1)
        got, loss, logs = one_step(FlatGRPOTrainer, tmp, qwen, questions, beta=0.1)
    assert abs(loss - expected_loss) <= TOL
    for key in ("reward", "kl", "entropy"):
        assert abs(logs[key] - expected_logs[key]) <= TOL, (key, logs[key], expected_logs[key])
    assert max((expected[n] - p).abs().max().item() for n, p in got.items()) <= TOL
