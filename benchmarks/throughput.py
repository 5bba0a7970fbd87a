"""Training throughput and peak memory, padded vs padded-to-max vs transformers' padding-free vs flattened vs packed,
for several length profiles.

    python benchmarks/throughput.py --profiles flan gsm8k --out-dir benchmarks/results/throughput

Every profile gets its own folder with `throughput.json`, `throughput.md`, `throughput.png` and `loss_curves.png`;
all options of `flatcollate bench` apply (see `--help`).
"""

import argparse
from pathlib import Path

from flatcollate.bench.cli import add_arguments, config_from_args, run_and_report, validate
from flatcollate.cli import HelpFormatter, UsageError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--profiles", nargs="+", default=["flan", "gsm8k"], help="length profiles, one run each")
    parser.add_argument(
        "--out-dir", type=Path, default=Path("benchmarks/results/throughput"), help="one folder per profile in it"
    )
    add_arguments(parser)
    args = parser.parse_args()
    set_keys = {item.partition("=")[0] for item in args.overrides}
    try:  # every profile's options are checked before the first one runs
        configs = {profile: config_from_args(args, profile=profile) for profile in args.profiles}
        for profile, config in configs.items():
            validate(config, args.out_dir / Path(profile).stem, set_keys=set_keys)
    except UsageError as error:
        parser.error(str(error))
    for profile, config in configs.items():
        print(f"== profile {profile}")
        run_and_report(config, args.out_dir / Path(profile).stem, progress=not args.no_progress)


if __name__ == "__main__":
    main()
