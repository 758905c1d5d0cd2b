"""The click that typer runs on, reached through typer's public names only: click itself up to
typer 0.25, typer's own copy of it from 0.26 (typer stopped depending on click there, and
0.29 rebuilt its groups and options on that copy: no ``click.Group``, no ``click_type``).

rayscope never imports click: what the command line needs of it (the usage errors, the
commands of the app, which options take a value, where a value came from) is named here
once, so a typer release that moves click again changes this file only. Every supported
typer is tested by ``make install-ends`` (the lowest and the newest the ranges allow).
"""

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    # The dev lock's typer (constraints.txt) runs on click itself: mypy reads click's types.
    from click import Command, Context
    from click.exceptions import BadOptionUsage, MissingParameter, NoSuchOption, UsageError
else:
    # typer.BadParameter is click's class, or the copy's: the module that defines it holds
    # the other usage errors, under the same names in both.
    _errors: ModuleType = sys.modules[typer.BadParameter.__module__]
    UsageError = _errors.UsageError
    NoSuchOption = _errors.NoSuchOption
    MissingParameter = _errors.MissingParameter
    BadOptionUsage = _errors.BadOptionUsage
    Command = Any
    Context = Any

BadParameter = typer.BadParameter
Abort = typer.Abort


class OptionError(typer.BadParameter):
    """A usage error whose message is the whole line (the option, the value, what to do)."""

    def format_message(self) -> str:
        return self.message


__all__ = [
    "Abort",
    "BadOptionUsage",
    "BadParameter",
    "Command",
    "Context",
    "MissingParameter",
    "NoSuchOption",
    "OptionError",
    "UsageError",
    "asks_for_help",
    "commands",
    "from_command_line",
    "from_environment",
    "message",
    "options_with_values",
    "root_command",
]


def root_command(app: typer.Typer) -> "Command":
    """The app as the command click runs (a group: ``commands`` maps each name to its command)."""
    return typer.main.get_command(app)


def commands(root: "Command") -> dict[str, "Command"]:
    """Each command of the group ``root`` by its name (empty for a single command)."""
    found: dict[str, Command] = dict(getattr(root, "commands", {}))
    return found


def options_with_values(command: "Command") -> set[str]:
    """Every spelling of ``command``'s options that take a value (not flags, not counters)."""
    return {
        name
        for param in command.params
        if param.param_type_name == "option"
        and not getattr(param, "is_flag", False)
        and not getattr(param, "count", False)
        for name in (*param.opts, *param.secondary_opts)
    }


def from_environment(ctx: "Context", name: str) -> bool:
    """Whether the parameter ``name`` got its value from its environment variable (the enum
    of value sources is click's or the copy's: compared by name)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "ENVIRONMENT"


def from_command_line(ctx: "Context", name: str) -> bool:
    """Whether the parameter ``name`` was typed on the command line (not its variable, not
    its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def asks_for_help(err: "UsageError") -> bool:
    """A command line with no command: click 8.2+ and typer's copy raise it as a usage error
    (``NoArgsIsHelpError``, the help already written or in the message), click 8.1 printed
    the help and exited 0 itself. rayscope keeps 8.1's answer on every version."""
    return type(err).__name__ == "NoArgsIsHelpError"


# typer 0.29 checks values with pydantic, whose messages start with the kind of error.
_PYDANTIC_PREFIX = "Value error, "


def message(err: "UsageError") -> str:
    """The error's own words, as click 8.1 says them (``'xml' is not one of ...``)."""
    said = str(getattr(err, "message", None) or err.format_message())
    return said.removeprefix(_PYDANTIC_PREFIX)
