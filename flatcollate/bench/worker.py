"""The worker process of `flatcollate bench`: trains one mode of one configuration and prints its figures as one JSON
line (`python -m flatcollate.bench.worker --worker '<payload>'`, started by `flatcollate.bench.isolated`)."""

import sys

from .isolated import config_from_json, measure_mode
from .repeats import serve_worker

WORKER_COMMAND = (sys.executable, "-m", "flatcollate.bench.worker")
"""How `flatcollate bench` starts a worker: this module, with the interpreter that runs the command."""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not serve_worker(argv, lambda case, mode: measure_mode(config_from_json(case["config"]), mode)):
        raise SystemExit("flatcollate.bench.worker: expected --worker '<payload>' (it is started by flatcollate bench)")


if __name__ == "__main__":
    main()
