# rayscope.pyz's __main__.py. Old syntax on purpose (no f-strings, no annotations): every
# Python must be able to parse this file, so that one older than 3.9 gets one line, not a
# SyntaxError or a traceback from the code that follows. Exit 2, rayscope's "no data" (status'
# exit 1 means partial): nothing was read.
import sys

if sys.version_info < (3, 9):  # noqa: UP036 - the point of this file
    sys.stderr.write("rayscope needs Python 3.9+, this is %d.%d.%d\n" % tuple(sys.version_info[:3]))  # noqa: UP031
    sys.exit(2)

import _rayscope_launch  # type: ignore[import-not-found]  # only after the version check

_rayscope_launch.main()
