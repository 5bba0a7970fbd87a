"""`flatcollate` command line: one sub-command per module that registers itself in `_COMMANDS`."""

import argparse
import importlib
import sys

# Each module here exposes `register_cli(subparsers)`, which adds its sub-parser and sets `func=` on it.
_COMMANDS: tuple[str, ...] = ("flatcollate.check", "flatcollate.bench.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flatcollate", description="Padding-free fine-tuning tools.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in _COMMANDS:
        importlib.import_module(module_name).register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
