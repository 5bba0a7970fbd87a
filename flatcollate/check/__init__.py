"""`flatcollate check`: proof that a model is exact on flattened batches, per attention backend.

- `model`: `check_model`, the entry point: text families (`text`) or image-text-to-text families (`vision`);
- `runs`: the runs every check makes and the one per-backend comparison loop; `report`: verdicts and reports;
- `tasks`: the checks of what training after SFT reads (`--task dpo`: per-sequence log-probabilities, `--task reward`:
  per-sequence scores); `vision_tasks`: the image-text side of `--task dpo` (`vision` runs it);
- `lengths`: sequence lengths that reach every window a config declares;
- `cli`: the `flatcollate check` command (builds its parser without importing torch).

Imports run one way: `cli` -> `model` -> `vision` -> `vision_tasks`, `tasks` -> `text`, `runs`, `lengths` -> `report`.
The check may import every other package of flatcollate (it proves them); none of them imports the check.

Each public name is imported from its module on first use, so `flatcollate check --help` loads no torch.

Imports from flatcollate: `_conventions`, `_lazy`, `_paths`, `cli`, `boundaries`, `families`, `attention`, `modeling`,
`testing`, `vision`, `preference`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "CheckReport": "report",
    "check_model": "model",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
