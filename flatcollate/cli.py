"""`flatcollate` command line: one sub-command per module that registers itself in `_COMMANDS`.

A user mistake (a bad option value, a missing folder, an unknown config key, and argparse's own: an invalid choice,
a missing argument) ends in one line on stderr, `flatcollate <command>: error: ...`, and exit status 2, before any
work starts; never in a usage block or a traceback.

Building the parser imports neither torch nor transformers (the command modules import them inside the functions that
run a command), so `--help` and `--version` answer at once.
"""

import argparse
import difflib
import importlib
import math
import sys
from typing import NoReturn

from . import __version__

# Each module here exposes `register_cli(subparsers)`, which adds its sub-parser and sets `func=` on it.
_COMMANDS: tuple[str, ...] = ("flatcollate.check.cli", "flatcollate.bench.cli")


class UsageError(ValueError):
    """A mistake in the command line, found before any work starts: printed as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose errors are one line and exit status 2, without the usage block.

    Sub-command parsers are built with the class of their parent (`add_subparsers` defaults `parser_class` to it), so
    every sub-command answers the same way.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(message: str) -> str:
    return " ".join(message.split())


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions kept as written, every option's default shown (flags and options without a value excepted)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        no_value = action.default is None or action.default is False or action.default == []
        if no_value or "(default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, else a one-line error naming the value."""
    return _at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0, else a one-line error naming the value."""
    return _at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0, else a one-line error naming the value.

    >>> positive_float("1e-5")
    1e-05
    >>> positive_float("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a positive, finite number, got 'nan'
    """
    error = argparse.ArgumentTypeError(f"expected a positive, finite number, got {text!r}")
    try:
        value = float(text)
    except ValueError:
        raise error from None
    if not (math.isfinite(value) and value > 0):
        raise error
    return value


def _at_least(text: str, minimum: int, what: str) -> int:
    error = argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    try:
        value = int(text)
    except ValueError:
        raise error from None
    if value < minimum:
        raise error
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="flatcollate",
        description="Padding-free fine-tuning tools: check a model is exact on flattened batches, benchmark it.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flatcollate {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="{check,bench}")
    for module_name in _COMMANDS:
        importlib.import_module(module_name).register_cli(subparsers)
    return parser


_TOP_OPTIONS = ("--help", "--version", "-h")


def _check_top_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Name an unknown option given before the command (argparse would only say that the command is missing)."""
    for token in argv:
        if not token.startswith("-"):
            return
        if token not in _TOP_OPTIONS:
            close = difflib.get_close_matches(token, _TOP_OPTIONS, n=1)
            hint = "--version" if token in ("-v", "-V") else close[0] if close else None
            parser.error(f"unrecognized option {token}" + (f"; did you mean {hint}?" if hint else ""))


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; returns the exit status (0 success, 1 a failed check, 2 a usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        _check_top_options(parser, argv)
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own errors (exit 2), `--help` and `--version` (exit 0)
        return int(exit_.code or 0)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        print(f"flatcollate {args.command}: error: {_one_line(str(error))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
