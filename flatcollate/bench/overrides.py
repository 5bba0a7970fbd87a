"""`--set KEY=VALUE` of `flatcollate bench`: parsed into model config overrides and checked against the model's config
before any work starts, for the SFT and the DPO benchmark alike."""

import difflib
import json
from pathlib import Path

from ..cli import UsageError


def parse_overrides(items: list[str], base: dict) -> dict:
    """`base` updated with every `KEY=VALUE` of `items` (values parsed as JSON, else kept as text).

    >>> parse_overrides(["hidden_size=256", "hidden_act=gelu"], {"hidden_size": 128})
    {'hidden_size': 256, 'hidden_act': 'gelu'}
    """
    overrides = dict(base)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set hidden_size=256).")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def check_overrides(config, keys: set[str]) -> None:
    """Raise `UsageError` unless every key of `keys` names an attribute of the model's config (`config.model`,
    shrunk by `tiny_config` when `config.tiny`) and sizes that are positive integers stay so in
    `config.model_overrides`."""
    from transformers import AutoConfig

    from ..models import tiny_config

    base = (
        AutoConfig.from_pretrained(config.model) if Path(config.model).is_dir() else AutoConfig.for_model(config.model)
    )
    if config.tiny:
        base = tiny_config(base)
    known = set(base.to_dict()) | set(base.attribute_map)
    for key in sorted(keys):
        if key not in known and not hasattr(base, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"--set {key}: the {base.model_type} config has no attribute {key!r}{hint}")
        current, value = getattr(base, key, None), config.model_overrides[key]
        is_size = isinstance(current, int) and not isinstance(current, bool) and current > 0
        if is_size and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise UsageError(
                f"--set {key}={json.dumps(value)}: {key} is a positive integer (the config has {current})."
            )
