"""Build ``dist/rayscope.pyz``: one file for CPython 3.9-3.13 on Linux x86_64 and aarch64.

    python build/pyz.py build [--out DIR]   # from build/pyz-lock.txt, hashes checked
    python build/pyz.py lock                # re-resolve build/pyz-lock.txt

How (build/README.md says why):

1. pip downloads every wheel of the lock for each target (CPython 3.9-3.13 x x86_64,
   aarch64), binary only, hash-checked, into ``build/cache/wheels``;
2. the wheels are unpacked into one site-packages tree: msgspec's extensions carry the
   Python version and the architecture in their file names, so all ten sit side by side;
   an abi3 extension (psutil's) does not, so such a wheel goes under ``_arch/<machine>/``
   and the launcher puts the right one on ``sys.path``; any other clash fails the build;
3. rayscope's own ``rayscope`` package (``agent/rayscope``) is copied in; ray is never bundled;
4. shiv zips the tree reproducibly (fixed timestamps, sorted entries, a build id that is
   the hash of the contents); the zip's ``__main__.py`` is then replaced by rayscope's
   (a version guard that parses on any Python, then ``build/launcher.py``);
5. ``rayscope.pyz.sha256`` is written beside the artifact (``sha256sum -c`` reads it).
"""

import argparse
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

BUILD = Path(__file__).resolve().parent
REPO = BUILD.parent
PACKAGE = REPO / "agent" / "rayscope"
"""The import package the single file carries (the source root is ``agent/``)."""
LOCK = BUILD / "pyz-lock.txt"
WHEEL_CACHE = BUILD / "cache" / "wheels"
LAUNCHER = BUILD / "launcher.py"
GUARD = BUILD / "zipmain.py"
ARTIFACT = "rayscope.pyz"
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
ARCHES = ("x86_64", "aarch64")
ENTRY_POINT = "rayscope.__main__:main"
SHEBANG = "/usr/bin/env python3"
ARCH_DIR = "_arch"
BUILD_INFO = "_rayscope_build.json"
# Metadata files that legitimately differ between the wheels of one release for different
# Pythons or machines; the first target's copy is kept.
PER_WHEEL_METADATA = ("RECORD", "WHEEL")
PIP_TIMEOUT_S = 600


class BuildError(Exception):
    """What went wrong, in one line."""


def log(message: str) -> None:
    print(f"pyz: {message}", file=sys.stderr, flush=True)


def pip(*args: str) -> None:
    """Run pip of this interpreter; quiet unless it fails."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise BuildError(f"pip {args[0]} failed:\n{done.stdout}{done.stderr}")


def target_args(python: str, arch: str) -> list[str]:
    """pip options that select wheels for one CPython version on one Linux machine.

    manylinux2014 (glibc 2.17) is the floor: pip also accepts older manylinux tags there.
    """
    abi = "cp" + python.replace(".", "")
    return [
        "--only-binary=:all:",
        f"--platform=manylinux2014_{arch}",
        f"--python-version={python}",
        "--implementation=cp",
        f"--abi={abi}",
    ]


# ---------------------------------------------------------------------------- the lock


def runtime_pins(constraints: Path) -> list[str]:
    """``name==version`` for each runtime dependency of rayscope (its installed metadata,
    extras such as ``ray`` left out) at the version the project lock pins."""
    deps = [d for d in importlib.metadata.requires("rayscope") or [] if "extra ==" not in d]
    names = [re.split(r"[<>=!~; \[]", d, maxsplit=1)[0] for d in deps]
    pins = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[canonical(name)] = version.strip()
    missing = [n for n in names if canonical(n) not in pins]
    if missing:
        raise BuildError(f"{constraints.name} pins no version of {', '.join(missing)}")
    return [f"{n}=={pins[canonical(n)]}" for n in names]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return canonical(name), version


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_lock() -> None:
    """Resolve the runtime closure for the oldest Python (what resolves there holds on the
    newer ones), then hash every wheel of it for every target."""
    top = runtime_pins(REPO / "constraints.txt")
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp, "resolved")
        pip("download", "--quiet", *target_args(PYTHONS[0], ARCHES[0]), "-d", str(resolved), *top)
        pins = sorted({wheel_name_version(p.name) for p in resolved.glob("*.whl")})
        hashes: dict[str, set[str]] = {name: set() for name, _ in pins}
        for python in PYTHONS:
            for arch in ARCHES:
                out = Path(tmp, f"{python}-{arch}")
                requirements = [f"{n}=={v}" for n, v in pins]
                pip(
                    "download",
                    "--quiet",
                    "--no-deps",
                    *target_args(python, arch),
                    "-d",
                    str(out),
                    *requirements,
                )
                for wheel in out.glob("*.whl"):
                    hashes[wheel_name_version(wheel.name)[0]].add(sha256_file(wheel))
    lines = [
        "# The zipapp's runtime closure: what dist/rayscope.pyz bundles, for CPython 3.9-3.13 on",
        "# Linux x86_64 and aarch64 (manylinux2014). Generated by `make pyz-lock` from the runtime",
        "# dependencies in pyproject.toml at the versions constraints.txt pins; their own dependencies",
        "# are resolved for Python 3.9, so they may be older than the dev lock's (3.11) versions.",
    ]
    for name, version in pins:
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{h} \\" for h in sorted(hashes[name])]
        lines[-1] = lines[-1].removesuffix(" \\")
    LOCK.write_text("\n".join(lines) + "\n")
    log(f"wrote {LOCK.relative_to(REPO)}: {len(pins)} packages")


def locked_pins(lock: Path) -> list[str]:
    """``name==version`` of every package in the lock."""
    return re.findall(r"^([A-Za-z0-9._-]+==[^ \\\n]+)", lock.read_text(), flags=re.MULTILINE)


# ---------------------------------------------------------------------------- the tree


def download(python: str, arch: str) -> list[Path]:
    """The lock's wheels for one target, hash-checked, from (or into) the wheel cache."""
    target_dir = WHEEL_CACHE / f"cp{python.replace('.', '')}-{arch}"
    pip("download", "--quiet", "--no-deps", "--require-hashes", *target_args(python, arch),
        "-d", str(target_dir), "-r", str(LOCK))  # fmt: skip
    wanted = {canonical(p.split("==")[0]): p.split("==")[1] for p in locked_pins(LOCK)}
    wheels = [w for w in sorted(target_dir.glob("*.whl")) if wanted.get(wheel_name_version(w.name)[0]) ==
              wheel_name_version(w.name)[1]]  # fmt: skip
    if len(wheels) != len(wanted):
        raise BuildError(f"expected {len(wanted)} wheels for cp{python} {arch}, found {len(wheels)}")
    return wheels


def wheel_is_abi3_native(wheel: Path) -> bool:
    """An extension whose file name says neither the Python nor the machine (``*.abi3.so``)."""
    _python_tag, abi_tag, platform_tag = wheel.name[:-4].split("-")[-3:]
    return platform_tag != "any" and abi_tag == "abi3"


def unpack(wheel: Path, tree: Path, prefix: str, seen: dict[str, bytes]) -> None:
    """Unpack one wheel under ``tree/prefix``; a file that clashes with a different one
    already there (other than per-wheel metadata) fails the build."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            top = info.filename.split("/", 1)[0]
            if top.endswith(".data"):
                raise BuildError(f"{wheel.name}: .data directories are not supported")
            rel = f"{prefix}{info.filename}"
            data = zf.read(info)
            if rel in seen:
                if seen[rel] != data and not (
                    top.endswith(".dist-info") and info.filename.rsplit("/", 1)[-1] in PER_WHEEL_METADATA
                ):
                    raise BuildError(
                        f"{rel} differs between targets (from {wheel.name}): cannot share one tree"
                    )
                continue
            seen[rel] = data
            path = tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def source_files(package: Path) -> Iterable[Path]:
    return sorted(p for p in package.rglob("*") if p.is_file() and p.suffix in (".py", ".typed"))


def stage(tree: Path, wheels: dict[tuple[str, str], list[Path]]) -> None:
    seen: dict[str, bytes] = {}
    for (_python, arch), target_wheels in wheels.items():
        for wheel in target_wheels:
            prefix = f"{ARCH_DIR}/{arch}/" if wheel_is_abi3_native(wheel) else ""
            unpack(wheel, tree, prefix, seen)
    for path in source_files(PACKAGE):
        dest = tree / path.relative_to(PACKAGE.parent)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    for path in tree.rglob("*"):  # modes from the umask would change the zip's bytes
        path.chmod(0o755 if path.is_dir() else 0o644)


# ---------------------------------------------------------------------------- the zip


def shiv(tree: Path, out: Path) -> dict[str, object]:
    """shiv's reproducible zipapp of ``tree``; returns its environment.json."""
    with tempfile.TemporaryDirectory() as empty:  # a clean cwd: shiv copies nothing from it
        done = subprocess.run(
            [sys.executable, "-m", "shiv", "--site-packages", str(tree), "--reproducible",
             "--entry-point", ENTRY_POINT, "--python", SHEBANG, "--output-file", str(out)],
            cwd=empty, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise BuildError(f"shiv failed:\n{done.stdout}{done.stderr}")
    with zipfile.ZipFile(out) as zf:
        env: dict[str, object] = json.loads(zf.read("environment.json"))
    return env


def build_info(env: dict[str, object], tree: Path) -> bytes:
    """What the launcher checks before anything is unpacked: where to unpack, and which
    interpreters the native libraries fit (by their extension suffixes)."""
    version = re.search(r'__version__ = "([^"]+)"', (PACKAGE / "__init__.py").read_text())
    suffixes = {m.group(1) for p in tree.rglob("*.so") if (m := re.search(r"(\.cpython-[^.]+\.so)$", p.name))}
    info = {
        "build_id": env["build_id"],
        "version": version.group(1) if version else "unknown",
        "entry_point": ENTRY_POINT,
        "pythons": list(PYTHONS),
        "machines": list(ARCHES),
        "extension_suffixes": sorted(suffixes),
    }
    return (json.dumps(info, indent=1, sort_keys=True) + "\n").encode()


def replace_main(shiv_zip: Path, out: Path, extra: dict[str, bytes]) -> None:
    """shiv's archive with rayscope's ``__main__.py`` and launcher; same timestamps, so
    the result is as reproducible as shiv's."""
    with zipfile.ZipFile(shiv_zip) as zin:
        infos = zin.infolist()
        date_time = infos[0].date_time
        with out.open("wb") as f:
            f.write(f"#!{SHEBANG}\n".encode())
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zout:
                for info in infos:
                    if info.filename in extra:
                        continue
                    copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                    copy.external_attr = info.external_attr
                    copy.compress_type = zipfile.ZIP_DEFLATED
                    zout.writestr(copy, zin.read(info))
                for name, data in sorted(extra.items()):
                    entry = zipfile.ZipInfo(name, date_time=date_time)
                    entry.external_attr = 0o100644 << 16
                    entry.compress_type = zipfile.ZIP_DEFLATED
                    zout.writestr(entry, data)
    out.chmod(0o755)


def build(out_dir: Path) -> Path:
    if not LOCK.exists():
        raise BuildError(f"{LOCK} is missing: run `make pyz-lock`")
    wheels = {(py, arch): download(py, arch) for py in PYTHONS for arch in ARCHES}
    log(f"{sum(len(w) for w in wheels.values())} wheels for {len(wheels)} targets, hashes checked")
    out_dir.mkdir(parents=True, exist_ok=True)
    artifact = out_dir / ARTIFACT
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp, "site-packages")
        stage(tree, wheels)
        shiv_zip = Path(tmp, "shiv.pyz")
        env = shiv(tree, shiv_zip)
        extra = {
            "__main__.py": GUARD.read_bytes(),
            "_rayscope_launch.py": LAUNCHER.read_bytes(),
            BUILD_INFO: build_info(env, tree),
        }
        partial = out_dir / f".{ARTIFACT}.partial"
        replace_main(shiv_zip, partial, extra)
        partial.replace(artifact)
    digest = sha256_file(artifact)
    (out_dir / f"{ARTIFACT}.sha256").write_text(f"{digest}  {ARTIFACT}\n")
    log(f"{artifact} {artifact.stat().st_size / 1e6:.2f} MB sha256 {digest}")
    return artifact


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="build/pyz.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build rayscope.pyz from the lock")
    build_cmd.add_argument("--out", type=Path, default=REPO / "dist", help="output directory (default dist/)")
    sub.add_parser("lock", help="re-resolve build/pyz-lock.txt")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            write_lock()
        else:
            build(args.out.resolve())
    except (BuildError, subprocess.TimeoutExpired) as err:
        print(f"pyz: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
