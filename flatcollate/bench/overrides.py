"""`--set KEY=VALUE` of `flatcollate bench`: parsed into model config overrides and checked against the model's config
before any work starts, for the SFT and the DPO benchmark alike."""

import difflib
import json

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


def check_sizes(base, overrides: dict, keys) -> None:
    """Raise `ValueError` (starting with the key) unless every key of `keys` names an attribute of the model config
    `base`, and sizes that are positive integers in `base` stay so in `overrides`."""
    known = set(base.to_dict()) | set(getattr(base, "attribute_map", {}))
    for key in sorted(keys):
        if key not in known and not hasattr(base, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(f"{key}: the {base.model_type} config has no attribute {key!r}{hint}")
        current, value = getattr(base, key, None), overrides[key]
        if _is_size(current) and not _is_size(value):
            raise ValueError(f"{key}={json.dumps(value)}: {key} is a positive integer (the config has {current}).")


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_overrides(config, keys: set[str]) -> None:
    """Raise `UsageError` naming the `--set` option unless every key of `keys` names an attribute of the model's config
    (`config.model`, shrunk by `tiny_config` when `config.tiny`) and sizes stay positive integers (`check_sizes`)."""
    from ..models import load_config, tiny_config

    base = load_config(config.model)
    try:
        check_sizes(tiny_config(base) if config.tiny else base, config.model_overrides, keys)
    except ValueError as error:
        raise UsageError(f"--set {error}") from None
