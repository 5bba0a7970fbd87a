"""The worker process of every benchmark: trains one mode of one task and prints its figures as one JSON line
(`python -m flatcollate.bench.worker --worker '<payload>'`, started by `flatcollate.bench.harness.run_bench`)."""

import sys

from .harness import measure
from .repeats import serve_worker


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not serve_worker(argv, measure):
        raise SystemExit("flatcollate.bench.worker: expected --worker '<payload>' (it is started by flatcollate bench)")


if __name__ == "__main__":
    main()
