"""Sequence lengths for `flatcollate check` that reach every mechanism a config declares, and what they exercised.

A check proves nothing about a mechanism its row never reaches: with a 4096-token sliding window and sequences of
7, 1, 12 and 4 tokens, a window mapped off by one in any backend would still print "exact". The lengths here come
from the config: one sequence longer than every window or attention chunk the config declares (by a few tokens, so
the window slides), a length-1 sequence, and an odd length::

    sliding_window 4     lengths (9, 1, 7, 6)      the 9- and 6-token sequences slide the window
    no window            lengths (7, 1, 12, 4)

A window too long for a CPU check (the per-sequence eager reference builds a `(T, T)` mask) is shrunk in the tiny
copy of the model to `SHRUNK_WINDOW` tokens, and the report says so: the mechanism is the same, only its size changes.
"""

from dataclasses import dataclass

from transformers import PretrainedConfig

WINDOW_KEYS = ("sliding_window", "attention_chunk_size", "window_size")
"""Config attributes holding a local-attention span: a window slides inside a sequence, a chunk restarts in it."""

NO_WINDOW_LENGTHS = (7, 1, 12, 4)
"""Lengths for configs without a window: a length-1 sequence, odd and even lengths."""

LONGEST_CHECKED = 512
"""Longest sequence a check builds to reach a window; longer windows are shrunk to `SHRUNK_WINDOW`."""

SHRUNK_WINDOW = 64
"""Window size the tiny copy gets when the config's window is longer than `LONGEST_CHECKED` allows."""

BITING_SOFTCAP = {"attn_logit_softcapping": 1.0, "initializer_range": 0.2}
"""Soft-capping that changes the scores of a random tiny model: with the usual initialisation its attention scores
stay near 0.03, far below a cap such as Gemma 2's 50, and a kernel that dropped the cap would still pass."""


@dataclass(frozen=True)
class CheckPlan:
    """The lengths of a check, the config changes they need, and a line per mechanism saying whether they reach it.

    Args:
        lengths (`tuple[int, ...]`): sequence lengths of the flattened row.
        overrides (`dict`): config attributes set on the tiny copy (shrunk windows).
        exercised (`dict[str, str]`): mechanism -> what the lengths did with it ("yes: ...", "no: ...", "not in
            config").
    """

    lengths: tuple[int, ...]
    overrides: dict
    exercised: dict


def _window(config: PretrainedConfig) -> tuple[str, int] | None:
    """The longest window or chunk the config declares, as `(attribute, tokens)`, or None."""
    found = [
        (key, value)
        for key in WINDOW_KEYS
        if isinstance(value := getattr(config, key, None), int) and not isinstance(value, bool) and value > 0
    ]
    return max(found, key=lambda item: item[1]) if found else None


def plan_check(
    config: PretrainedConfig, *, lengths: tuple[int, ...] | None = None, stateful: bool = False, shrink: bool = True
) -> CheckPlan:
    """Lengths that reach every window of `config` (unless given), and what they exercise.

    Args:
        config (`PretrainedConfig`): the (tiny) config the check builds its model from.
        lengths (`tuple[int, ...]`, *optional*): lengths chosen by the caller; they are reported on, not changed.
        stateful (`bool`): the family has layers that carry state along the row (run once per sequence).
        shrink (`bool`): a window too long to reach may be shrunk (False for a model given as it is).

    >>> from flatcollate.testing import tiny_config
    >>> plan_check(tiny_config("mistral", sliding_window=4)).lengths
    (9, 1, 7, 6)
    >>> plan_check(tiny_config("llama")).lengths
    (7, 1, 12, 4)
    >>> plan = plan_check(tiny_config("mistral", sliding_window=4096))
    >>> plan.overrides, plan.lengths
    ({'sliding_window': 64}, (69, 1, 7, 66))
    """
    window = _window(config)
    lengths_given = lengths
    overrides: dict = {}
    if shrink and window is not None and lengths is None and window[1] + 5 > LONGEST_CHECKED:
        overrides[window[0]] = SHRUNK_WINDOW
    span = None if window is None else (window[0], overrides.get(window[0], window[1]))
    if lengths is None:
        lengths = NO_WINDOW_LENGTHS if span is None else (span[1] + 5, 1, 7, span[1] + 2)
    longest = max(lengths)
    exercised = {}
    if span is None:
        exercised["window / chunk"] = "not in config"
    else:
        key, size = span
        shrunk = f" (config's {window[1]} shrunk to {size} for a CPU check)" if key in overrides else ""
        reached = longest > size
        verdict = "yes" if reached else "NO: no sequence is longer than it; the check says nothing about it"
        exercised[f"{key} {size}{shrunk}"] = f"{verdict} (longest sequence {longest})"
    exercised["length-1 sequence"] = "yes" if 1 in lengths else "no"
    exercised["odd length"] = "yes" if any(n % 2 for n in lengths if n > 1) else "no"
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap and shrink and lengths_given is None:
        overrides.update(BITING_SOFTCAP)
        exercised["soft-capping"] = f"yes (config's {softcap} set to 1.0, weights scaled up so that it bites)"
    elif softcap:
        exercised["soft-capping"] = f"in config ({softcap}); scores of random weights may stay below it"
    else:
        exercised["soft-capping"] = "not in config"
    exercised["state-carrying layers"] = "yes (every sequence)" if stateful else "not in this family"
    return CheckPlan(lengths=tuple(lengths), overrides=overrides, exercised=exercised)
