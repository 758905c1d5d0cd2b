"""Entry for ``rayscope`` (the console script), ``python -m rayscope`` and the zipapp
(``rayscope.__main__:main``): ``status``'s fast paths first (:mod:`rayscope.cli.fast_status`), then
the typer CLI (:mod:`rayscope.cli.app`) for everything they hand on."""

import sys

# Before anything else is imported: an old Python gets one line, not a traceback, and exit 2
# (rayscope.errors.EXIT_NO_DATA: nothing was read; status' exit 1 means partial).
if sys.version_info < (3, 9):  # noqa: UP036
    sys.stderr.write("rayscope needs Python 3.9+, this is %d.%d.%d\n" % tuple(sys.version_info[:3]))  # noqa: UP031
    sys.exit(2)


def main() -> None:
    """The command line: answered by :func:`rayscope.cli.fast_status.run` when it can (it exits),
    else by the CLI. Whatever escapes both is one line and exit 70 (an internal error),
    never a traceback and exit 1 ("partial" to cron)."""
    import gc

    # The fast paths allocate while importing and make no garbage cycles: the collector's
    # passes were 6% of `status --head --json`'s CPU. The CLI gets it back.
    collecting = gc.isenabled()
    gc.disable()
    try:
        from rayscope.errors import one_line_errors

        with one_line_errors(verbose=bool({"--verbose", "-v"} & set(sys.argv[1:]))):
            from rayscope.cli import fast_status

            fast_status.run(sys.argv[1:])
            if collecting:
                gc.enable()
            from rayscope.cli.app import main as cli_main

            cli_main()
    finally:
        if collecting:
            gc.enable()


if __name__ == "__main__":
    main()
