"""Entry for ``python -m agent`` and for the zipapp (``agent.__main__:main``)."""

import sys

# Before anything else is imported: an old Python gets one line, not a traceback.
if sys.version_info < (3, 9):  # noqa: UP036
    sys.stderr.write("rayscope needs Python 3.9+, this is %d.%d.%d\n" % tuple(sys.version_info[:3]))  # noqa: UP031
    sys.exit(1)

from agent.cli import main

if __name__ == "__main__":
    main()
