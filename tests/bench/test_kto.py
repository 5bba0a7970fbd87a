"""The KTO benchmark (`flatcollate bench --task kto`): its examples are the pairs taken apart, with the completions and
KL completions `KTOTrainer` itself builds from them, and the padding it reports is what TRL's collator pads. What
every preference task shares is tested in `test_pair_tasks.py`. No timing is asserted."""

import copy

import datasets
import numpy as np
import pytest

from flatcollate.bench.config import PairBenchConfig
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens
from flatcollate.bench.tasks.kto import padded_kto_tokens, unpaired_lengths
from flatcollate.synthetic import offline_tokenizer
from flatcollate.synthetic.pairs import PairDraw, pair_texts

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")


def test_the_examples_are_what_kto_trainer_tokenizes_and_rotates(tmp_path):
    """TRL's own dataset preparation (tokenized prompt, completion with its eos, KL completion rotated within each
    batch) gives `unpaired_lengths`, batch by batch; rotating over the whole dataset instead is caught (control)."""
    from flatcollate.testing import tiny_causal_lm

    draw = draw_pairs(PairBenchConfig(max_length=256, steps=2, warmup_steps=1, batch_size=2))
    rows = [
        {"prompt": row["prompt"], "completion": row[reply], "label": reply == "chosen"}
        for row in pair_texts(draw, vocab_size=100, seed=0)
        for reply in ("chosen", "rejected")
    ]
    model = tiny_causal_lm("llama", vocab_size=100)
    args = trl.KTOConfig(tmp_path, per_device_train_batch_size=4, max_length=256, use_cpu=True, report_to=[])
    trainer = trl.KTOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=offline_tokenizer(100),
    )
    keys = ("prompt_ids", "completion_ids", "KL_completion_ids")
    got = np.array([[len(row[key]) for key in keys] for row in trainer.train_dataset])
    expected = np.stack(unpaired_lengths(draw, batch_size=2), axis=1)
    np.testing.assert_array_equal(got, expected)
    _, completion, _ = unpaired_lengths(draw, batch_size=2)
    assert not np.array_equal(got[:, 2], np.roll(completion, 1)), "a rotation over the whole dataset differs"


def test_padding_is_what_trls_kto_collator_pads():
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    rng = np.random.default_rng(0)
    draw = PairDraw(*(rng.integers(low, 30, size=6) for low in (1, 0, 0)), max_length=40)
    prompt, completion, kl = unpaired_lengths(draw, batch_size=3)
    real, slots = padded_kto_tokens(draw, batch_size=3)
    collator = DataCollatorForUnpairedPreference(pad_token_id=0, max_length=40)
    for index, start in enumerate(range(0, 12, 6)):
        part = slice(start, start + 6)
        examples = [
            {
                "prompt_ids": [1] * int(p),
                "completion_ids": [2] * int(c),
                "KL_completion_ids": [3] * int(k),
                "label": True,
            }
            for p, c, k in zip(prompt[part], completion[part], kl[part], strict=True)
        ]
        batch = collator(examples)
        assert batch["attention_mask"].sum() + batch["KL_attention_mask"].sum() == real[index]
        assert batch["input_ids"].numel() + batch["KL_input_ids"].numel() == slots[index]
    # Control: DPO's layout (the pair's two sequences, no KL batch) counts other tokens.
    assert not np.array_equal(padded_pair_tokens(draw, batch_size=3)[0], real)
