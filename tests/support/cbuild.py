"""The one ``cc`` command that builds the fake C libraries (the fake NVML, the fake CUDA):
a shared object, warnings as errors."""

import subprocess
from collections.abc import Sequence
from pathlib import Path


def shared_library(
    cc: str, source: Path, library: Path, flags: Sequence[str] = (), libraries: Sequence[str] = ()
) -> None:
    """Compile ``source`` into ``library`` with ``flags`` (defines) and link ``libraries`` after it."""
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            *flags,
            "-o",
            str(library),
            str(source),
            *libraries,
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
