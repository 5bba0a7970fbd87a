"""Synthetic rows for offline examples and tests: a `datasets.Dataset` of random token ids whose lengths follow a real
length profile, and a word-level tokenizer built in memory for them."""

import datasets
import numpy as np

from .._conventions import IGNORE_INDEX


def synthetic_sft_dataset(
    num_examples: int,
    *,
    profile: str = "gsm8k",
    vocab_size: int = 256,
    seed: int = 0,
    response_template: list[int] | None = None,
    max_tokens: int | None = None,
) -> datasets.Dataset:
    """Prompt/completion examples of random ids, with prompt labels set to -100.

    Args:
        num_examples (`int`): rows to make.
        profile (`str`): a length profile of `flatcollate.profiles.load_profile` (`"gsm8k"`, `"flan"`, ...).
        vocab_size (`int`): ids are drawn from `[0, vocab_size)`, never from the template's ids.
        seed (`int`): the same seed gives the same rows.
        response_template (`list[int]`, *optional*): ids inserted between prompt and completion (for the
            completion-only collator, which finds them); they are part of the prompt.
        max_tokens (`int`, *optional*): lengths are scaled down so no row exceeds this many tokens.

    Returns:
        `datasets.Dataset` with `input_ids` (list of int64) and `labels` (prompt and template -100).

    >>> ds = synthetic_sft_dataset(4, response_template=[7, 8], seed=1)
    >>> row = ds[0]
    >>> len(row["input_ids"]) == len(row["labels"]), row["labels"][0]
    (True, -100)
    """
    from ..profiles import load_profile

    prompt_lengths, completion_lengths = load_profile(profile).sample(num_examples, seed=seed)
    template = list(response_template or [])
    if max_tokens is not None:
        longest = int((prompt_lengths + completion_lengths).max()) + len(template)
        if longest > max_tokens:
            scale = (max_tokens - len(template)) / (longest - len(template))
            prompt_lengths = np.maximum((prompt_lengths * scale).astype(np.int64), 1)
            completion_lengths = np.maximum((completion_lengths * scale).astype(np.int64), 1)
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(template, dtype=np.int64))
    rows = {"input_ids": [], "labels": []}
    for p, c in zip(prompt_lengths.tolist(), completion_lengths.tolist(), strict=True):  # one row per example
        prompt = rng.choice(allowed, p).tolist() + template
        completion = rng.choice(allowed, c).tolist()
        rows["input_ids"].append(prompt + completion)
        rows["labels"].append([IGNORE_INDEX] * len(prompt) + completion)
    return datasets.Dataset.from_dict(rows)


def offline_tokenizer(vocab_size: int = 256):
    """A word-level tokenizer built in memory (no download) whose words are `t0`, `t1`, ...: synthetic ids are
    random, so any vocabulary of the right size serves; `<pad>` and `<eos>` are its last two ids.

    >>> tokenizer = offline_tokenizer()
    >>> tokenizer("t3 t7")["input_ids"], len(tokenizer), tokenizer.eos_token_id
    ([3, 7], 256, 255)
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 2)} | {"<pad>": vocab_size - 2, "<eos>": vocab_size - 1}
    backend = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def synthetic_rows(num_examples: int, *, seed: int, max_len: int, vocab_size: int = 256) -> list[dict]:
    """Tokenized rows of random lengths in `[1, max_len]`, about a third of their labels -100 (prompt tokens), as the
    distributed examples and their tests use them.

    >>> rows = synthetic_rows(3, seed=0, max_len=5)
    >>> [len(r["input_ids"]) == len(r["labels"]) for r in rows], max(len(r["input_ids"]) for r in rows) <= 5
    ([True, True, True], True)
    """
    rng = np.random.default_rng(seed)
    rows = []
    for length in rng.integers(1, max_len + 1, size=num_examples):  # one row per example
        ids = rng.integers(0, vocab_size, size=int(length))
        labels = np.where(rng.random(ids.size) < 0.3, IGNORE_INDEX, ids)
        rows.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return rows
