"""Start-up time of a rayscope.pyz under every CPython found on this machine.

    python build/bench.py dist/rayscope.pyz [--runs 7]

For each interpreter (``~/.pyenv/versions/*``, ``python3.X`` on PATH): *cold* is the first
``--help`` with an empty cache (unpacking and compiling included), *warm* the median of
the next runs; both under ``python -I``, as an operator runs it. Prints a Markdown table
(build/README.md quotes it). Numbers, not a test: the machine's load moves them.
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERSION_PROBE = "import sys, platform; sys.stdout.write('%s %d.%d.%d' % ((platform.python_implementation(),) + tuple(sys.version_info[:3])))"  # noqa: E501
RUN_TIMEOUT_S = 120


def find_pythons() -> dict[str, str]:
    """``{"3.11.7": path}``: one CPython per minor version, pyenv's first, then PATH's."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(os.path.join(root, "versions", "*", "bin", "python3")))
    candidates += [p for p in (shutil.which(f"python3.{minor}") for minor in range(6, 15)) if p]
    found: dict[str, str] = {}
    minors: set[str] = set()
    for path in candidates:
        try:
            probe = [path, "-c", VERSION_PROBE]
            out = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        implementation, _, version = out.partition(" ")
        minor = version.rsplit(".", 1)[0]
        if implementation == "CPython" and minor not in minors:
            minors.add(minor)
            found[version] = path
    return dict(sorted(found.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("."))))


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pyz", type=Path)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    size_mb = args.pyz.stat().st_size / 1e6
    print(f"{args.pyz.name}: {size_mb:.2f} MB; `--help`, seconds, {os.cpu_count()} CPUs\n")
    print("| Python | cold (empty cache) | warm (median) |")
    print("| --- | --- | --- |")
    for version, python in find_pythons().items():
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "RAYSCOPE_CACHE": cache}
            command = [python, "-I", str(args.pyz), "--help"]
            cold = timed(command, env)
            warm = statistics.median(timed(command, env) for _ in range(args.runs))
        print(f"| {version} | {cold:.2f} | {warm:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
