"""``make install-ends``: the dependency ranges of pyproject.toml, true at both ends.

Two fresh venvs, each given ``pip install .`` of this checkout (the wheel hatchling builds out
of tree), and no ray (it is the host's own):

* ``newest``: no constraints file, whatever the ranges resolve to today;
* ``lowest``: a constraints file pinning every dependency at the lower bound of its range,
  written here from pyproject.toml (a range without a lower bound is an error).

In each, with the tools of the tests from the lock (constraints.txt, none of them a dependency
of rayscope): the console script's ``--version``, every command's ``--help``, and the non-live
tests of :data:`TESTS`, the files that drive the dependencies whose versions differ between
the ends (the whole non-live suite takes too long for CI twice over: see :data:`TESTS`). The
tests import the installed rayscope, not the checkout's. Then one seed cluster (started by
this Python, which has ray) is read from each venv by ``tests/consumer.py`` (the API) and
``rayscope status``: the GCS read runs under the Ray node's Python, found from the raylet's
process, as the single file's does.

Prints the versions each end resolved to; exit 1 when any check failed. ``--ends lowest``
runs one end.
"""

import argparse
import email
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.ports import refused_port

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "constraints.txt"
ENDS = ("newest", "lowest")
INSTALL_TIMEOUT_S = 1200.0
RUN_TIMEOUT_S = 120.0
TESTS_TIMEOUT_S = 1800.0
TEST_TOOLS = ("pytest", "hypothesis", "jsonschema", "pexpect", "PyYAML")
"""What the chosen tests import besides rayscope's dependencies, at the lock's versions."""

TESTS = {
    "tests/test_cli.py": "typer: the commands, their options, exit codes",
    "tests/test_cli_messages.py": "typer's click: every usage error as one line",
    "tests/test_help.py": "typer: every command's --help fits its width, one line per command",
    "tests/test_wire.py": "msgspec: frames and reports on the wire",
    "tests/test_report_bounds.py": "msgspec: the bounds checked in C while decoding",
    "tests/test_schemas.py": "msgspec: the JSON schemas of the documents",
    "tests/test_render.py": "msgspec: the documents as encoded (golden files)",
    "tests/test_bioengine_contract.py": "msgspec: BioEngine's document shape",
    "tests/test_procs.py": "psutil: the processes on a GPU and their actors",
    "tests/test_raylet.py": "psutil: the raylet found from its process",
    "tests/test_local_trust.py": "psutil: who owns a process, a file, an interpreter",
    "tests/test_nvml_scenarios.py": "nvidia-ml-py: the real binding on the fake driver",
    "tests/test_nvml_modes.py": "nvidia-ml-py: vGPU, MIG and the modes NVML reports",
    "tests/test_health.py": "nvidia-ml-py: the health fields",
    "tests/test_live_api.py": "the API: public names only, import rayscope stays cheap",
}
"""The non-live tests each end runs, by the dependency they drive. Left out: the tests of the
pure core (rollup, fit, placement, usage …: no dependency of another version reaches them),
the fast path's 183 cases (the standard library only, before typer) and the single file's
(it bundles the lock's versions, whatever the venv holds). Measured under load (8 sessions
on 2 cores): the whole non-live suite is ~1,100 tests, and its first ~100 took 9 minutes,
far over CI's budget twice; these files are 217 tests, 47-49 s per end."""

DESELECT = (
    "tests/test_help.py::test_help_matches_its_golden_file",
    "tests/test_schemas.py::test_committed_schemas_are_what_the_code_generates",
)
"""Files generated at the lock's versions, compared byte for byte: the help's golden files
are typer's drawing (see the test), schema/*.schema.json msgspec's rendering of the Structs
(0.23 keeps docstrings' indentation). The documents are still checked against the schemas."""


def say(text: str) -> None:
    sys.stdout.write(f"install-ends: {text}\n")
    sys.stdout.flush()


def requirements_of_checkout(work: Path) -> list[str]:
    """The ``Requires-Dist`` of the wheel this checkout builds (what ``pip install .`` reads)."""
    out = work / "wheel"
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)])
    if done.returncode != 0:
        raise RuntimeError(f"the wheel did not build:\n{done.stderr[-3000:]}")
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name)).get_all("Requires-Dist", [])


def lower_bounds(requirements: Sequence[str]) -> dict[str, str]:
    """Each runtime dependency's lowest allowed version (``>=``, ``==`` or ``~=``'s bound);
    ``ValueError`` for a range without one. Extras (ray) are not runtime dependencies."""
    bounds = {}
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None:
            continue
        lowest = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if len(lowest) != 1:
            raise ValueError(f"{text!r} in pyproject.toml: give it one lower bound (>=X)")
        bounds[requirement.name] = lowest[0]
    return bounds


def run(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    timeout: float = RUN_TIMEOUT_S,
    cwd: Path = REPO,
) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env or clean_env()),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would make a venv's Python import the checkout or
    another environment's packages."""
    return without_paths(
        os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", **extra
    )


def without_paths(environ: Mapping[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def pip(venv: Path, *args: str) -> None:
    done = run(
        [str(venv / "bin" / "pip"), "--disable-pip-version-check", "--quiet", *args],
        timeout=INSTALL_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def versions(venv: Path) -> dict[str, str]:
    done = run([str(venv / "bin" / "pip"), "list", "--format", "json", "--disable-pip-version-check"])
    return {canonical(p["name"]): p["version"] for p in json.loads(done.stdout)}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class End:
    """One venv, its checks and what failed in them."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.venv = root / name
        self.failures: list[str] = []
        self.resolved: dict[str, str] = {}
        self.summary = ""

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def check(self, ok: bool, what: str) -> None:
        say(f"{self.name}: {'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            self.failures.append(what)

    def install(self, bounds: Mapping[str, str], work: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=RUN_TIMEOUT_S)
        constraints: list[str] = []
        if self.name == "lowest":
            path = work / "lowest-constraints.txt"
            path.write_text("".join(f"{name}=={version}\n" for name, version in bounds.items()))
            constraints = ["-c", str(path)]
        pip(self.venv, "install", *constraints, str(REPO))
        self.resolved = versions(self.venv)
        pip(self.venv, "install", "-c", str(LOCK), *TEST_TOOLS)
        after = versions(self.venv)
        moved = {n: (v, after.get(n)) for n, v in self.resolved.items() if after.get(n) != v}
        self.check(not moved, f"the test tools moved no installed package {moved or ''}".strip())
        self.check("ray" not in after, "no ray in the venv (the host's own)")
        if self.name == "lowest":
            wrong = {
                n: self.resolved.get(canonical(n))
                for n, v in bounds.items()
                if Version(self.resolved.get(canonical(n), "0")) != Version(v)
            }
            self.check(not wrong, f"every dependency at its lower bound {wrong or ''}".strip())

    def check_cli(self) -> None:
        from rayscope import __version__

        script = str(self.venv / "bin" / "rayscope")
        done = run([script, "--version"])
        self.check(
            (done.returncode, done.stdout) == (0, f"rayscope {__version__}\n"),
            f"rayscope --version: {done.stdout.strip()}{done.stderr.strip()[-300:]}",
        )
        listed = run([self.python, "-c", COMMANDS])
        names = listed.stdout.split()
        self.check(
            listed.returncode == 0 and bool(names), f"the commands: {' '.join(names)}{listed.stderr[-300:]}"
        )
        for name in ["", *names]:
            done = run([script, *([name] if name else []), "--help"], env=clean_env(COLUMNS="100"))
            self.check(
                done.returncode == 0 and "Usage: rayscope" in done.stdout,
                f"rayscope {name} --help".replace("  ", " "),
            )
        where = run([self.python, "-c", "import rayscope; print(rayscope.__file__)"], cwd=REPO)
        self.check(
            where.stdout.startswith(str(self.venv)),
            f"the tests import the installed rayscope ({where.stdout.strip()})",
        )

    def run_tests(self) -> None:
        argv = [
            self.python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not live and not ray_here",
            *TESTS,
        ]
        argv += [f"--deselect={d}" for d in DESELECT]
        started = time.monotonic()
        done = run(argv, env=clean_env(), timeout=TESTS_TIMEOUT_S)
        took = time.monotonic() - started
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        self.summary = f"{last} in {took:.0f} s"
        if done.returncode != 0:
            sys.stdout.write(done.stdout[-6000:] + done.stderr[-2000:])
        self.check(done.returncode == 0, f"pytest -m 'not live' on {len(TESTS)} files: {last}")

    def check_gcs_via_ray_python(self, gcs: str, head_node: str, env: Mapping[str, str]) -> None:
        """The API and ``status`` from a venv without ray: the GCS read under the raylet's Python."""
        done = run(
            [self.python, str(REPO / "tests" / "consumer.py"), gcs, f"127.0.0.1:{refused_port()}"],
            env=env,
            cwd=Path("/"),
            timeout=300,
        )
        try:
            doc: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            self.check(False, f"tests/consumer.py: {done.stderr.strip()[-600:]}")
            return
        via = next((s["detail"] for s in doc["state"]["sources"] if s["name"] == "gcs"), "")
        self.check(
            " via " in via and not via.endswith(f" via {self.python}"),
            f"cluster_state(gcs=...) read the GCS under another Python ({via})",
        )
        head = doc["state"]["nodes"][head_node]
        self.check(
            head["used_vram_mb"] == 20480, f"cluster_state: the head's used_vram_mb {head['used_vram_mb']}"
        )
        self.check(doc["fit"]["fits"] is True, "fit(gpu_memory_mb=4096, gcs=...) fits")
        self.check(
            done.stderr == "" and doc["ray_imported"] is False, "the API printed nothing, imported no ray"
        )
        status = run(
            [str(self.venv / "bin" / "rayscope"), "status", "--gcs", gcs, "--timeout", "60"],
            env=env,
            timeout=300,
        )
        self.check(
            status.returncode == 0 and "[HEAD]" in status.stdout,
            f"rayscope status --gcs: exit {status.returncode} {status.stderr.strip()[-300:]}",
        )


COMMANDS = (
    "from rayscope.cli.app import app; from rayscope.cli import typer_click as t;"
    " print(' '.join(t.commands(t.root_command(app))))"
)

SHOWN = ("msgspec", "typer", "click", "rich", "psutil", "nvidia-ml-py")


def table(ends: Sequence[End]) -> str:
    rows = [f"{'':8}" + "".join(f"{name:>15}" for name in SHOWN)]
    for end in ends:
        rows.append(f"{end.name:8}" + "".join(f"{end.resolved.get(n, '-'):>15}" for n in SHOWN))
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ends", default=",".join(ENDS), help="newest,lowest (the default) or one of them")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rayscope-ends-"))
    ends = [End(name, work) for name in args.ends.split(",")]
    try:
        bounds = lower_bounds(requirements_of_checkout(work))
        say("lower bounds: " + ", ".join(f"{n} {v}" for n, v in bounds.items()))
        for end in ends:
            started = time.monotonic()
            end.install(bounds, work)
            say(f"{end.name}: installed in {time.monotonic() - started:.0f} s")
            end.check_cli()
            end.run_tests()
        from tests.conftest import running_cluster

        with running_cluster("seed") as cluster:
            for end in ends:
                end.check_gcs_via_ray_python(
                    cluster.gcs_address, cluster.node_id("head"), without_paths(cluster.env)
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(table(ends) + "\n")
    for end in ends:
        sys.stdout.write(f"{end.name}: {end.summary}\n")
    failed = [f"{end.name}: {what}" for end in ends for what in end.failures]
    checks_failed = len(failed)
    sys.stdout.write("\n".join(failed) + ("\n" if failed else ""))
    say("every check passed" if not checks_failed else f"{checks_failed} check(s) failed")
    return 1 if checks_failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
