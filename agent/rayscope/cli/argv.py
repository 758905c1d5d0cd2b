"""The command line before click reads it, and its mistakes as one line.

* ``--watch`` alone means every 2 s: click options take a value or none, not either (and
  typer drops click's ``flag_value``), so a bare ``--watch`` gets the default here;
* the global options (``--verbose``, ``-v``) work after the command too (``rayscope status
  --verbose``): they are moved before it, unless they are the value of an option;
* a usage error is one line on stderr, ``rayscope: status --timeout nan: not a finite
  number: ...`` (exit 2), never click's or rich's box: cron mail and ``grep`` get one line.
  On a terminal a short hint follows (where ``--help`` is).
"""

import sys
from collections.abc import Sequence
from typing import Optional

import typer

from rayscope.cli import names, typer_click
from rayscope.cli.options import WATCH_DEFAULT_S
from rayscope.errors import EXIT_INTERRUPTED, EXIT_USAGE, say

GLOBAL_FLAGS = names.VERBOSE.flags


def optional_watch_value(argv: Sequence[str]) -> list[str]:
    """``--watch`` without a number → ``--watch 2``."""
    args = list(argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--":
            return out + args[i + 1 :]
        if arg == "--watch":
            following = args[i + 1] if i + 1 < len(args) else ""
            if not following or (following.startswith("-") and not _is_number(following)):
                out.append(f"{WATCH_DEFAULT_S:g}")  # else its value, a number or not ("2s" is refused)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def global_flags_first(argv: Sequence[str], group: typer_click.Command) -> list[str]:
    """``status --verbose --json`` → ``--verbose status --json``; a flag that is an option's
    value (``--token-file -v``) or comes after ``--`` stays where it is."""
    args = list(argv)
    at = next((i for i, arg in enumerate(args) if not arg.startswith("-") or arg == "--"), len(args))
    command = typer_click.commands(group).get(args[at]) if at < len(args) else None
    if command is None:
        return args
    values = typer_click.options_with_values(command)
    moved: list[str] = []
    kept = args[: at + 1]
    rest = iter(args[at + 1 :])
    for arg in rest:
        if arg == "--":
            kept += [arg, *rest]
            break
        if arg in GLOBAL_FLAGS:
            moved.append(arg)
            continue
        kept.append(arg)
        value = next(rest, None) if arg in values else None
        if value is not None:
            kept.append(value)
    return moved + kept


def _where(ctx: Optional[typer_click.Context], command: str) -> str:
    """``status`` for ``rayscope status``; empty for the top level. Click's parser raises some
    errors without a context (an option missing its value): then the command named in argv."""
    if ctx is None:
        return command
    return ctx.command_path.partition(" ")[2]


def _option(err: typer_click.UsageError) -> str:
    param = getattr(err, "param", None)  # click's Option or typer's own, by its kind's name
    if param is not None and param.param_type_name == "option":
        return str(param.opts[0])
    return str(getattr(err, "param_hint", None) or getattr(err, "option_name", None) or "")


RAY_OPTIONS = {"--address": "--gcs", "--gcs-address": "--gcs"}
"""Ray's own names for an option rayscope calls otherwise (``ray status --address``)."""


def _instead(err: typer_click.NoSuchOption) -> str:
    """`` (did you mean --gcs?)``; for Ray's name of an option, rayscope's: `` (Ray's name:
    the GCS address is --gcs HOST:PORT here)``; ``""`` when nothing is close."""
    ours = RAY_OPTIONS.get(err.option_name)
    takes = {opt for p in err.ctx.command.params for opt in p.opts} if err.ctx is not None else set()
    if ours is not None and ours in takes:
        return f" (Ray's name: the GCS address is {ours} HOST:PORT here)"
    return f" (did you mean {' or '.join(err.possibilities)}?)" if err.possibilities else ""


def _named(quoted: str) -> str:
    """The name in click's ``'statuss'.`` (its repr, maybe followed by typer's suggestion).
    Imports here: a usage error's path only, not every start's."""
    import ast
    import re

    found = re.match(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""", quoted)
    if found is None:
        return quoted
    try:
        return str(ast.literal_eval(found.group(1)))
    except (ValueError, SyntaxError):
        return found.group(1)[1:-1]


def usage_line(err: typer_click.UsageError, commands: Sequence[str], command: str = "") -> str:
    """The one line a usage error is said in (without the ``rayscope:`` prefix); ``command``:
    the command argv names, if any."""
    where = _where(err.ctx, command)
    said = err.format_message().strip().rstrip(".")
    if isinstance(err, typer_click.OptionError):
        return f"{where} {said}".strip()
    if isinstance(err, typer_click.NoSuchOption):
        text = f"no such option {err.option_name}{_instead(err)}"
    elif isinstance(err, typer_click.MissingParameter):
        text = f"{_option(err)} is required"
    elif isinstance(err, typer_click.BadParameter):
        return f"{where} {_option(err)}: {typer_click.message(err).rstrip('.')}".strip()
    elif isinstance(err, typer_click.BadOptionUsage) and "requires an argument" in said:
        return f"{where} {err.option_name}: needs a value".strip()
    elif said.startswith("No such command"):
        import difflib  # click's own way to find what was meant

        name = _named(said[len("No such command ") :])
        close = difflib.get_close_matches(name, commands)
        maybe = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"{name!r} is not a command{maybe}: {', '.join(commands)}"
    elif said.startswith("Missing command"):
        return f"give a command: {', '.join(commands)} (rayscope --help)"
    else:
        text = said
    return f"{where}: {text}" if where else text


def run(app: typer.Typer, argv: Sequence[str]) -> None:
    """``rayscope ARGV``: the exit code of the command, a usage error as one line (exit 2),
    Ctrl-C as 130. Raises ``SystemExit`` always."""
    group = typer_click.root_command(app)
    names = typer_click.commands(group)
    args = global_flags_first(optional_watch_value(argv), group)
    try:
        code = group.main(args=args, prog_name="rayscope", standalone_mode=False)
    except typer_click.UsageError as err:
        if typer_click.asks_for_help(err):
            help_text = err.format_message()  # empty where typer has written the help itself
            if help_text:
                typer.echo(help_text)
            raise SystemExit(0) from None
        first = next((arg for arg in args if not arg.startswith("-")), "")
        command = first if first in names else ""
        say(usage_line(err, sorted(names), command))
        if sys.stderr.isatty():
            where = _where(err.ctx, command)
            sys.stderr.write(f"  (rayscope {where + ' ' if where else ''}--help lists the options)\n")
        raise SystemExit(EXIT_USAGE) from None
    except typer_click.Abort:
        raise SystemExit(EXIT_INTERRUPTED) from None
    raise SystemExit(code if isinstance(code, int) else 0)
