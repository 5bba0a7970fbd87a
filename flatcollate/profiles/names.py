"""The named length profiles shipped with the package, as plain paths: nothing here imports numpy or torch, so
`flatcollate bench --help` lists them at once."""

from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parent / "data"
"""Folder of the named profiles shipped with the package."""

PAIR_PROFILES_DIR = PROFILES_DIR / "pairs"
"""Folder of the named pair profiles (prompt, chosen and rejected lengths of preference pairs)."""


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package.

    >>> available_profiles()
    ['code_alpaca', 'flan', 'gsm8k', 'hh_rlhf']
    """
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def available_pair_profiles() -> list[str]:
    """Names of the pair profiles shipped with the package (`flatcollate bench --task dpo`).

    >>> available_pair_profiles()
    ['hh_rlhf']
    """
    return sorted(p.stem for p in PAIR_PROFILES_DIR.glob("*.json"))
