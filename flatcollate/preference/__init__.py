"""Padding-free training after SFT: per-sequence outputs of a flattened row and preference pairs.

- `logprobs`: `sequence_logprobs`, each sequence's log-probabilities of its labelled tokens (DPO, GRPO log-prob
  passes), the label shift never crossing a boundary;
- `scores`: `sequence_scores`, a sequence-classification head (reward model) applied at each sequence's last token,
  and `prepare_reward_model`, which prepares the backbone for it;
- `collate`: `DataCollatorForPreference`, each example's chosen and rejected sequences in one flattened row;
- `unpaired_collate`: `DataCollatorForUnpairedPreference`, unpaired examples (KTO: a completion and its label) in one
  flattened row, their KL completions in a second;
- `vision_collate`: `VisionDataCollatorForPreference`, image-text pairs processed as TRL's vision collator processes
  them, each pair's chosen and rejected sequences (with its images, twice) in one flattened row;
- `completions`: the core both preference collators share, `prompt + completion` sequences in one flattened row;
- `reward_collate`: `DataCollatorForRewardPairs`, tokenized reward pairs (`chosen_ids`, `rejected_ids`, `margin`) in
  one flattened row, every chosen sequence then every rejected one.

The TRL trainers built on them live in `flatcollate.integrations.trl`. Each public name is imported from its module on
first use.

Imports from flatcollate: `_conventions`, `_lazy`, `boundaries`, `collate`, `modeling`, `vision`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "DataCollatorForPreference": "collate",
    "DataCollatorForRewardPairs": "reward_collate",
    "DataCollatorForUnpairedPreference": "unpaired_collate",
    "VisionDataCollatorForPreference": "vision_collate",
    "prepare_reward_model": "scores",
    "sequence_logprobs": "logprobs",
    "sequence_scores": "scores",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
