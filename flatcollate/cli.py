"""`flatcollate` command line: one sub-command per module that registers itself in `_COMMANDS`.

A user mistake (a bad option value, a missing folder, an unknown config key) ends in one line on stderr,
`flatcollate <command>: error: ...`, and exit status 2, before any work starts; never in a traceback.
"""

import argparse
import importlib
import sys

# Each module here exposes `register_cli(subparsers)`, which adds its sub-parser and sets `func=` on it.
_COMMANDS: tuple[str, ...] = ("flatcollate.check_cli", "flatcollate.bench.cli")


class UsageError(ValueError):
    """A mistake in the command line, found before any work starts: printed as one line, exit status 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions kept as written, every option's default shown (flags and options without a value excepted)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        no_value = action.default is None or action.default is False or action.default == []
        if no_value or "(default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flatcollate",
        description="Padding-free fine-tuning tools: check a model is exact on flattened batches, benchmark it.",
        formatter_class=HelpFormatter,
    )
    import flatcollate  # at call time: this module is imported while the package itself is still initialising

    parser.add_argument("--version", action="version", version=f"flatcollate {flatcollate.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="{check,bench}")
    for module_name in _COMMANDS:
        importlib.import_module(module_name).register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; returns the exit status (0 success, 1 a failed check, 2 a usage error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse's own errors (exit 2), `--help` and `--version` (exit 0)
        return int(exit_.code or 0)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        print(f"flatcollate {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
