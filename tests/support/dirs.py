"""Directories other users can reach, as on a shared node (pytest's own are private to the test's user)."""

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def open_dir(prefix: str, mode: int) -> Iterator[Path]:
    """A new directory under the system's temporary one, with ``mode``; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(mode)
    yield path
    shutil.rmtree(path, ignore_errors=True)
