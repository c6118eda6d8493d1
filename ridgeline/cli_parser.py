"""The parser class of `ridgeline` and of every subcommand: each option's help shows its default, and
`--help` shows the options most users need (`brief`) while `--help-all` shows every one.

`add_subparsers()` builds subcommand parsers with the parent's class, so a subcommand registered
from another module (`serve`, `bench`, `advise`, ...) gets this behaviour without naming it, and a
`formatter_class` it passes (e.g. RawDescriptionHelpFormatter) keeps working with the defaults
mixed in.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys


class DefaultsHelpMixin:
    """Appends "(default: X)" to the help of every option that takes a value, unless the help already
    says what the default is. Not shown: a default of None (the help must say what happens, e.g.
    "default: the model's own", since 'None' tells a user nothing), suppressed defaults, and switches
    (store_true/false/const: their default is not passing them)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text == argparse.SUPPRESS or not shows_default(action) or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def shows_default(action: argparse.Action) -> bool:
    """Whether the formatter appends this action's default to its help."""
    if action.default is None or action.default is argparse.SUPPRESS or action.nargs == 0:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)


@functools.cache
def with_defaults(formatter: type) -> type:
    if issubclass(formatter, DefaultsHelpMixin):
        return formatter
    return type(f"Defaults{formatter.__name__}", (DefaultsHelpMixin, formatter), {})


class _HelpAll(argparse.Action):
    """--help-all: print every option (the ones --help leaves out included) and exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(parser.format_help(full=True), sys.stdout)
        parser.exit()


class RidgelineParser(argparse.ArgumentParser):
    """`brief`: the dests of the options --help shows (None: all of them); positional arguments, --help,
    --help-all and --version are always shown. The others are hidden by giving them argparse.SUPPRESS as
    help for the time the text is formatted, so --help-all and the generated reference read the same help."""

    def __init__(self, *args, formatter_class: type = argparse.HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=with_defaults(formatter_class), **kwargs)
        self.brief: frozenset[str] | None = None
        if self.add_help:
            self.add_argument("--help-all", action=_HelpAll, help="show every option with its default and exit")

    def hidden_actions(self) -> list[argparse.Action]:
        """The options --help leaves out."""
        if self.brief is None:
            return []
        always = (argparse._HelpAction, argparse._VersionAction, _HelpAll)
        return [a for a in self._actions if a.option_strings and not isinstance(a, always)
                and a.dest not in self.brief and a.help is not argparse.SUPPRESS]

    @contextlib.contextmanager
    def _brief_view(self):
        hidden = self.hidden_actions()
        saved = [a.help for a in hidden]
        empty = [g for g in self._action_groups if g._group_actions and all(a in hidden for a in g._group_actions)]
        descriptions = [g.description for g in empty]
        for a in hidden:
            a.help = argparse.SUPPRESS
        for g in empty:  # a group with nothing left to show loses its description too
            g.description = None
        try:
            yield len(hidden)
        finally:
            for a, text in zip(hidden, saved):
                a.help = text
            for g, text in zip(empty, descriptions):
                g.description = text

    def format_usage(self) -> str:
        with self._brief_view():
            return super().format_usage()

    def format_help(self, full: bool = False) -> str:
        if full:
            return super().format_help()
        with self._brief_view() as hidden:
            text = super().format_help()
        if hidden:
            text += f"\n{hidden} more options: `{self.prog} --help-all` lists every one\n"
        return text


# Argument types: a bad value is a usage error before anything loads ("argument --repeats: ...").

def _number(kind: type, text: str, low: float, what: str, allow_inf: bool = False):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or value < low or (value == float("inf") and not allow_inf):  # nan fails value == value
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _number(int, text, 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    return _number(float, text, 0, "a number >= 0")


def positive_float(text: str) -> float:
    value = _number(float, text, 0, "a positive number")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_float_or_inf(text: str) -> float:
    value = _number(float, text, 0, "a positive number or inf", allow_inf=True)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive number or inf, got {text!r}")
    return value


def output_file(text: str) -> str:
    """A file the command will write at its end: its folder must exist now, not after an hour of benchmark."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder} is not writable")
    return text
