"""Training throughput and peak memory, padded vs padded-to-max vs transformers' padding-free vs flattened vs packed,
for several length profiles.

    python benchmarks/throughput.py --profiles flan gsm8k --out-dir benchmarks/results/throughput

Every timed pass runs in a fresh process (`flatcollate.bench.harness`): each of `--repeats` repeats trains every
mode once, the modes taking turns, and ratios to padded are taken within each repeat. Every profile gets its own
folder with `throughput.json`, `throughput.md`, `throughput.png` and `throughput_loss_curves.png`; the options of
`flatcollate bench`'s text task apply (see `--help`). A mistake in the options is one line on stderr and exit status
2, before anything runs.
"""

import sys
from pathlib import Path

from flatcollate.bench.cli import add_arguments, config_from_args, run_and_report, validate
from flatcollate.bench.harness import get_task
from flatcollate.cli import UsageError

from _common import command_line, script_parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark for every profile; returns the exit status (0, or 2 for a usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--profiles", nargs="+", default=["flan", "gsm8k"], help="length profiles, one run each")
    parser.add_argument(
        "--out-dir", type=Path, default=Path("benchmarks/results/throughput"), help="one folder per profile in it"
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own one-line errors (exit 2) and --help (exit 0)
        return int(exit_.code or 0)
    task = get_task("sft")
    try:  # every profile's options are checked before the first one runs
        configs = {}
        for profile in args.profiles:
            args.profile = profile
            configs[profile] = config_from_args(task, args)
            validate(task, configs[profile], args.out_dir / Path(profile).stem)
    except UsageError as error:
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(f"command: `{command_line(__file__, argv)}`")
    for profile, config in configs.items():
        print(f"== profile {profile}")
        run_and_report(task, config, args.out_dir / Path(profile).stem, progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
