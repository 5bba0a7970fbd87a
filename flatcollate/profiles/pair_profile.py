"""Pair profiles: the token lengths of real preference pairs, `(prompt, chosen reply, rejected reply)` per pair, so the
DPO benchmark can draw batches whose padding is that of the real data.

A pair profile stores the length triples themselves, no text. The one shipped with the package, "hh_rlhf"
(`flatcollate/profiles/data/pairs/hh_rlhf.json`), holds the pairs of Anthropic's HH-RLHF (harmless-base, test split),
each transcript split at its last assistant turn::

    chosen    "\\n\\nHuman: Hi\\n\\nAssistant: Hello!\\n\\nHuman: A joke?\\n\\nAssistant: No."
    rejected  "\\n\\nHuman: Hi\\n\\nAssistant: Hello!\\n\\nHuman: A joke?\\n\\nAssistant: Sure: ..."
              |<------------------- prompt (shared head + marker) ------------>|<- reply ->|

and counted with Qwen2.5's tokenizer, without special tokens (TRL appends the eos to each reply when it trains;
`flatcollate.bench.pairs` adds it). `python -m flatcollate.profiles.make <data folder>` re-creates it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .._paths import expand_path
from .names import PAIR_PROFILES_DIR, available_pair_profiles

PAIR_FORMAT = "flatcollate.pair_lengths/1"
ASSISTANT = "\n\nAssistant:"
"""Where an HH-RLHF transcript's last reply starts: the prompt ends with this marker, the reply follows it."""


@dataclass(frozen=True)
class PairProfile:
    """Token lengths of preference pairs, one row per pair.

    Args:
        name (`str`): where the profile came from.
        prompt (`np.ndarray` of shape `(N,)`, int64): prompt tokens of each pair (shared by both replies).
        chosen (`np.ndarray` of shape `(N,)`, int64): tokens of each chosen reply, >= 0.
        rejected (`np.ndarray` of shape `(N,)`, int64): tokens of each rejected reply, >= 0.
        source (`str`): free text describing the data and tokenizer.
    """

    name: str
    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray
    source: str = ""

    @property
    def num_rows(self) -> int:
        return int(self.prompt.size)

    def sample(
        self, n: int, *, seed: int = 0, max_prompt: int | None = None, max_pair: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw `n` pairs (rows with replacement, uniformly), optionally only among those with fewer than
        `max_prompt` prompt tokens and those whose prompt + longer reply is at most `max_pair` tokens.

        Returns:
            `(prompt, chosen, rejected)`, each `np.ndarray` of shape `(n,)`, int64.

        >>> profile = PairProfile("toy", np.array([3, 9]), np.array([1, 2]), np.array([4, 5]))
        >>> [a.tolist() for a in profile.sample(3, seed=0, max_prompt=5)]
        [[3, 3, 3], [1, 1, 1], [4, 4, 4]]
        """
        eligible = np.flatnonzero(self.prompt < max_prompt) if max_prompt is not None else np.arange(self.num_rows)
        if eligible.size == 0:
            raise ValueError(
                f"No pair of the profile {self.name!r} has a prompt shorter than {max_prompt} tokens (the shortest has "
                f"{int(self.prompt.min())}); raise `max_length`."
            )
        if max_pair is not None:
            longest = self.prompt + np.maximum(self.chosen, self.rejected)
            eligible = eligible[longest[eligible] <= max_pair]
            if eligible.size == 0:
                raise ValueError(
                    f"No pair of the profile {self.name!r} fits in {max_pair} tokens, prompt + longer reply (the "
                    f"shortest has {int(longest.min())}); raise `max_length`."
                )
        rows = eligible[np.random.default_rng(seed).integers(0, eligible.size, size=n)]
        return self.prompt[rows], self.chosen[rows], self.rejected[rows]

    def to_dict(self) -> dict:
        """JSON-ready form read back by `load_pair_profile`."""
        rows = np.stack([self.prompt, self.chosen, self.rejected], axis=1)
        return {
            "format": PAIR_FORMAT,
            "name": self.name,
            "source": self.source,
            "num_rows": self.num_rows,
            "columns": ["prompt", "chosen", "rejected"],
            "rows": rows.tolist(),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as a compact JSON file."""
        expand_path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")) + "\n")


def load_pair_profile(name_or_path: str | os.PathLike) -> PairProfile:
    """A named pair profile (`available_pair_profiles()`) or a JSON file written by `PairProfile.save`.

    >>> load_pair_profile("hh_rlhf").num_rows > 2000
    True
    """
    text = os.fspath(name_or_path)
    path = PAIR_PROFILES_DIR / f"{text}.json" if text in available_pair_profiles() else expand_path(text)
    if not path.is_file():
        raise ValueError(
            f"Unknown pair profile {text!r}: not a named one ({', '.join(available_pair_profiles())}) and no file "
            "at that path. Pass a name or a JSON file written by `PairProfile.save`."
        )
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("format") != PAIR_FORMAT:
        raise ValueError(f"{path} is not a pair profile (a JSON file of format {PAIR_FORMAT} written by `save`).")
    rows = np.asarray(data["rows"], dtype=np.int64).reshape(-1, 3)
    if rows.shape[0] == 0 or (rows < 0).any():
        raise ValueError(f"{path}: a pair profile needs at least one row and no negative length.")
    return PairProfile(data["name"], *rows.T.copy(), source=data.get("source", ""))


def split_pair(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """`(prompt, chosen reply, rejected reply)` of two transcripts split at their last `ASSISTANT` marker; `None`
    when a transcript has no marker or the two heads differ (the pair has no shared prompt).

    >>> split_pair("\\n\\nHuman: Hi\\n\\nAssistant: Yo", "\\n\\nHuman: Hi\\n\\nAssistant: Go away")
    ('\\n\\nHuman: Hi\\n\\nAssistant:', ' Yo', ' Go away')
    """
    head, marker, chosen_reply = chosen.rpartition(ASSISTANT)
    other, other_marker, rejected_reply = rejected.rpartition(ASSISTANT)
    if not (marker and other_marker) or head != other:
        return None
    return head + ASSISTANT, chosen_reply, rejected_reply


def pair_profile_from_transcripts(rows, tokenizer, *, name: str, source: str) -> tuple[PairProfile, int]:
    """Count the tokens of every pair's prompt and replies (`split_pair`), without special tokens.

    Args:
        rows (iterable of `dict`): `{"chosen": str, "rejected": str}` transcripts.
        tokenizer: a Hugging Face tokenizer.
        name (`str`), source (`str`): stored in the profile.

    Returns:
        `(PairProfile, skipped)`: `skipped` counts the rows `split_pair` refused.
    """
    texts, skipped = [], 0
    for row in rows:  # one split per pair
        parts = split_pair(row["chosen"], row["rejected"])
        if parts is None:
            skipped += 1
        else:
            texts.append(parts)
    if not texts:
        raise ValueError(f"No row of {source!r} splits into a prompt and two replies at {ASSISTANT!r}.")
    columns = [[text[i] for text in texts] for i in range(3)]
    lengths = [
        np.fromiter(map(len, tokenizer(column, add_special_tokens=False)["input_ids"]), np.int64) for column in columns
    ]
    return PairProfile(name, *lengths, source=source), skipped
