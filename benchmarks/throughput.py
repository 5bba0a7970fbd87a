"""Training throughput and peak memory, padded vs padded-to-max vs transformers' padding-free vs flattened vs packed,
for several length profiles.

    python benchmarks/throughput.py --profiles flan gsm8k --out-dir benchmarks/results/throughput

Every timed pass runs in a fresh process (`flatcollate.bench.isolated`): each of `--repeats` repeats trains every
mode once, the modes taking turns, and ratios to padded are taken within each repeat. Every profile gets its own
folder with `throughput.json`, `throughput.md`, `throughput.png` and `loss_curves.png`; all options of
`flatcollate bench` apply (see `--help`). A mistake in the options is one line on stderr and exit status 2, before
anything runs.
"""

import sys
from pathlib import Path

from flatcollate.bench.cli import add_arguments, config_from_args, validate
from flatcollate.bench.isolated import config_from_json, measure_mode, run_throughput_in_processes
from flatcollate.bench.repeats import command_line, serve_worker
from flatcollate.bench.scripts import script_parser
from flatcollate.cli import UsageError


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark for every profile; returns the exit status (0, or 2 for a usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, lambda case, mode: measure_mode(config_from_json(case["config"]), mode)):
        return 0
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
    set_keys = {item.partition("=")[0] for item in args.overrides}
    try:  # every profile's options are checked before the first one runs
        configs = {profile: config_from_args(args, profile=profile) for profile in args.profiles}
        for profile, config in configs.items():
            validate(config, args.out_dir / Path(profile).stem, set_keys=set_keys)
    except UsageError as error:
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(f"command: `{command_line(__file__, argv)}`")
    for profile, config in configs.items():
        print(f"== profile {profile}")
        run_and_report(config, args.out_dir / Path(profile).stem, progress=not args.no_progress)
    return 0


def run_and_report(config, out_dir: Path, *, progress: bool) -> dict:
    """Measure one profile in fresh processes, print its summary and write its report files."""
    from flatcollate.bench.report import summary_text, write_report

    result = run_throughput_in_processes(config, [sys.executable, __file__], progress=progress)
    print(summary_text(result))
    for path in write_report(result, out_dir):
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
