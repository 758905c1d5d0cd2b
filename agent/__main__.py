"""Entry for ``rayscope`` (the console script), ``python -m agent`` and the zipapp
(``agent.__main__:main``): ``status``'s fast paths first (:mod:`agent.fast_status`), then
the typer CLI (:mod:`agent.cli`) for everything they hand on."""

import sys

# Before anything else is imported: an old Python gets one line, not a traceback.
if sys.version_info < (3, 9):  # noqa: UP036
    sys.stderr.write("rayscope needs Python 3.9+, this is %d.%d.%d\n" % tuple(sys.version_info[:3]))  # noqa: UP031
    sys.exit(1)


def main() -> None:
    """The command line: answered by :func:`agent.fast_status.run` when it can (it exits),
    else by the CLI. Whatever escapes both is one line and exit 70 (an internal error),
    never a traceback and exit 1 ("partial" to cron)."""
    from agent.errors import one_line_errors

    with one_line_errors(verbose=bool({"--verbose", "-v"} & set(sys.argv[1:]))):
        from agent import fast_status

        fast_status.run(sys.argv[1:])
        from agent.cli import main as cli_main

        cli_main()


if __name__ == "__main__":
    main()
