"""The benchmark tasks, one module each, each defining `TASK` (`flatcollate.bench.harness.Task`): `sft` (text SFT,
`flatcollate bench`), `vision` (image-text SFT, `--vision`), `dpo`, `kto` and `reward` (TRL's preference trainers
against flatcollate's, `--task dpo|kto|reward`) and `grpo` (GRPO's log-prob pass, `--task grpo`). A new task is a new
module here: the harness and the command line find it by its name."""

import pkgutil


def task_names() -> list[str]:
    """Names of the tasks, one per module of this package (nothing is imported, so `--help` can list them).

    >>> task_names()
    ['dpo', 'grpo', 'kto', 'reward', 'sft', 'vision']
    """
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
