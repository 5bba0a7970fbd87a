"""Training throughput and peak memory, padded vs padded-to-max vs flattened vs packed, for several length profiles.

    python benchmarks/throughput.py --profiles flan gsm8k --out-dir benchmarks/results/throughput

Every profile gets its own folder with `throughput.json`, `throughput.md`, `throughput.png` and `loss_curves.png`;
all options of `flatcollate bench` apply (see `--help`).
"""

import argparse
from pathlib import Path

from flatcollate.bench.cli import add_arguments, config_from_args, run_and_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", nargs="+", default=["flan", "gsm8k"], help="length profiles, one run each")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/throughput"))
    add_arguments(parser)
    args = parser.parse_args()
    for profile in args.profiles:
        print(f"== profile {profile}")
        config = config_from_args(args, profile=profile)
        run_and_report(config, args.out_dir / Path(profile).stem, progress=not args.no_progress)


if __name__ == "__main__":
    main()
