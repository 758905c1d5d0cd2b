"""A systemd unit's sandbox without systemd: the same restrictions, read from the unit file.

The live test of deploy/systemd/ (tests/test_systemd_units.py) runs the agents under their
units' sandboxes. ``systemd-run --pipe --wait -p ...`` needs a running systemd as PID 1,
which neither this project's development machines nor CI have (a container's init is not
systemd); so each sandboxing line of the unit is applied here by the tool that does the same
thing in the kernel:

* bubblewrap (``bwrap``), run as root, for the mounts: ``ProtectSystem=strict`` (the whole
  tree bound read-only, ``/proc`` and ``/sys`` with it, as ``ProtectKernelTunables`` and
  ``ProtectControlGroups`` make them), ``ProtectHome``, ``PrivateTmp``, the
  ``StateDirectory``/``CacheDirectory`` bound writable at ``/var/lib``/``/var/cache``
  (the rest of those two trees hidden: stricter than systemd, never looser), and
  ``DevicePolicy=closed`` with ``DeviceAllow`` as a ``/dev`` holding only the standard
  nodes plus the allowed ones (systemd filters with the device cgroup instead);
* util-linux's ``prlimit`` for ``LimitNOFILE`` (capped at this host's hard limit, which a
  container without ``CAP_SYS_RESOURCE`` cannot raise), then ``setpriv`` for ``User=``,
  ``CapabilityBoundingSet=`` (and no inheritable or ambient capability) and
  ``NoNewPrivileges``;
* :func:`exec_main` (this module, run inside) for ``UMask`` and the seccomp filters,
  built with libseccomp (systemd's own library for them) the way systemd builds them:
  ``SystemCallFilter`` (groups expanded by ``systemd-analyze syscall-filter``, denied calls
  answered ``SystemCallErrorNumber``), ``SystemCallArchitectures=native``,
  ``RestrictAddressFamilies``, ``RestrictNamespaces``, ``MemoryDenyWriteExecute``,
  ``LockPersonality``, ``RestrictRealtime``, ``RestrictSUIDSGID``; then ``execve``.

:data:`APPLIED` names every line this applies, :data:`NOT_SANDBOX` the lines that are no
sandbox (what to run, when, as whom is mapped), :data:`NOT_APPLIED` the rest with the reason;
:func:`check_covered` fails on a line in none of them, so a new hardening line cannot go
untested silently.
"""

import ctypes
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

APPLIED = frozenset(
    {
        "User",
        "NoNewPrivileges",
        "CapabilityBoundingSet",
        "UMask",
        "LimitNOFILE",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "DevicePolicy",
        "DeviceAllow",
        "CacheDirectory",
        "StateDirectory",
        "ProtectKernelTunables",
        "ProtectControlGroups",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectClock",
        "ProtectHostname",
        "PrivateMounts",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
        "SystemCallArchitectures",
        "SystemCallFilter",
        "SystemCallErrorNumber",
        "Environment",
        "ExecStart",
    }
)
"""Unit lines the sandbox applies (``ProtectKernelModules``, ``ProtectClock``,
``ProtectHostname``, ``ProtectKernelLogs``: through the system-call filter's
``~@privileged``, the read-only ``/proc`` and ``/sys``, and no capability)."""
NOT_SANDBOX = frozenset(
    {"Description", "After", "Wants", "WantedBy", "Type", "Restart", "RestartSec", "RestartPreventExitStatus"}
    | {"OnCalendar", "AccuracySec", "CacheDirectoryMode", "StateDirectoryMode"}
)
"""Lines that say what runs when, not what it may do (the directories' modes: the test
creates them so)."""
NOT_APPLIED = {
    "RemoveIPC": "acts after the service stops (its System V IPC objects are removed)",
}

API_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx")
"""What ``DevicePolicy=closed`` always allows; bwrap's ``--dev`` makes the same nodes."""
UNIT_DIRS = {"StateDirectory": "/var/lib", "CacheDirectory": "/var/cache"}
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))
SPECIFIERS = {"%S": "/var/lib", "%C": "/var/cache", "%%": "%"}


class UnitError(Exception):
    """A unit this sandbox cannot reproduce (a line it does not know, a value it does not)."""


def parse_unit(path: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit, keys in all sections, values in order (a key may be
    given several times; an empty assignment resets the list, as systemd reads it)."""
    properties: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UnitError(f"{path.name}: not a Key=value line: {line}")
        values = properties.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()
    return properties


def check_covered(properties: Mapping[str, Sequence[str]]) -> None:
    """:class:`UnitError` for a line that is neither applied nor known not to need it."""
    unknown = sorted(set(properties) - APPLIED - NOT_SANDBOX - set(NOT_APPLIED))
    if unknown:
        raise UnitError(f"the sandbox does not know {', '.join(unknown)}: apply it in tests/unit_sandbox.py")


def expand(value: str) -> str:
    return re.sub(r"%[SC%]", lambda m: SPECIFIERS[m.group(0)], value)


def syscall_group(name: str) -> set[str]:
    """The system calls of ``@group`` (recursively, as ``systemd-analyze syscall-filter``
    lists them), or ``{name}`` for a single call."""
    if not name.startswith("@"):
        return {name}
    done = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, timeout=30, check=True
    )
    calls: set[str] = set()
    for line in done.stdout.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            calls |= syscall_group(item)
    return calls


def allowed_syscalls(lines: Sequence[str]) -> set[str]:
    """``SystemCallFilter`` lines as systemd reads them: the first line an allow list (it
    does not start with ``~``), each later line adding to it or, with ``~``, taking away."""
    if not lines or lines[0].startswith("~"):
        raise UnitError("SystemCallFilter: the sandbox applies an allow list only (a first line without ~)")
    allowed: set[str] = set()
    for line in lines:
        deny = line.startswith("~")
        names = line.lstrip("~").split()
        calls = set().union(*(syscall_group(n) for n in names))
        allowed = allowed - calls if deny else allowed | calls
    return allowed


ADDRESS_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}


def seccomp_spec(properties: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """What :func:`exec_main` loads, from the unit's lines."""

    def yes(key: str) -> bool:
        return (properties.get(key) or ["no"])[-1] in ("yes", "true", "1", "on")

    if (properties.get("SystemCallArchitectures") or ["native"]) != ["native"]:
        raise UnitError("SystemCallArchitectures: the sandbox applies native only")
    families = " ".join(properties.get("RestrictAddressFamilies", [])).split()
    if families and families[0].startswith("~"):
        raise UnitError("RestrictAddressFamilies: the sandbox applies an allow list only")
    errno_name = (properties.get("SystemCallErrorNumber") or ["EPERM"])[-1]
    return {
        "allow": sorted(allowed_syscalls(properties.get("SystemCallFilter", []))),
        "errno": int(getattr(__import__("errno"), errno_name)),
        "families": [ADDRESS_FAMILIES[f] for f in families],
        "namespaces": yes("RestrictNamespaces"),
        "mdwe": yes("MemoryDenyWriteExecute"),
        "personality": yes("LockPersonality"),
        "realtime": yes("RestrictRealtime"),
        "suid": yes("RestrictSUIDSGID"),
        "umask": int((properties.get("UMask") or ["0022"])[-1], 8),
    }


def device_nodes(allow: Sequence[str]) -> list[tuple[str, str]]:
    """(``/dev`` node, ``r``/``rw``) for each ``DeviceAllow`` line, nodes that exist here:
    ``char-NAME`` is every character device whose major ``/proc/devices`` names NAME."""
    majors: dict[str, set[int]] = {}
    section = ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line[:-1].split()[0].lower()
            continue
        number, _, name = line.strip().partition(" ")
        if section == "character" and number.isdigit():
            majors.setdefault(name, set()).add(int(number))
    nodes: list[tuple[str, str]] = []
    for entry in allow:
        spec, _, mode = entry.partition(" ")
        wanted = majors.get(spec[len("char-") :], set()) if spec.startswith("char-") else set()
        for root, _dirs, files in os.walk("/dev"):
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if path == spec or (
                    wanted and (st.st_mode & 0o170000) == 0o020000 and os.major(st.st_rdev) in wanted
                ):
                    nodes.append((path, mode or "rw"))
    return sorted(set(nodes))


YES = frozenset({"yes", "true", "1", "on"})


def _last(properties: Mapping[str, Sequence[str]], key: str, default: str = "no") -> str:
    return (properties.get(key) or [default])[-1]


def _mounts(
    properties: Mapping[str, Sequence[str]], directories: Mapping[str, Path], stand_ins: Sequence[Path]
) -> list[str]:
    """bwrap's options for the file-system lines (ProtectSystem, ProtectHome, PrivateTmp,
    the devices, the unit's directories)."""
    if _last(properties, "ProtectSystem") != "strict":
        raise UnitError("ProtectSystem: the sandbox applies strict (the whole tree read-only)")
    argv = ["--ro-bind", "/", "/"]
    home = _last(properties, "ProtectHome")
    if home in YES or home == "tmpfs":
        for hidden in ("/home", "/root", "/run/user"):
            if os.path.isdir(hidden):
                argv += ["--tmpfs", hidden, "--remount-ro", hidden]
    elif home != "read-only":  # read-only: the read-only root already is
        raise UnitError(f"ProtectHome={home}: the sandbox applies yes, tmpfs or read-only")
    if _last(properties, "PrivateTmp") in YES:
        argv += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        for stand_in in stand_ins:  # what a real node keeps in /opt and /etc, here in a test's /tmp
            argv += ["--ro-bind", str(stand_in), str(stand_in)]
    return argv + _devices_and_directories(properties, directories)


def _devices_and_directories(
    properties: Mapping[str, Sequence[str]], directories: Mapping[str, Path]
) -> list[str]:
    """bwrap's options for PrivateDevices/DevicePolicy/DeviceAllow and the unit's directories."""
    argv = []
    devices = device_nodes(properties.get("DeviceAllow", []))
    if _last(properties, "PrivateDevices") in YES:
        devices = []
    elif _last(properties, "DevicePolicy", "auto") != "closed":
        raise UnitError("the sandbox applies PrivateDevices=yes or DevicePolicy=closed")
    argv += ["--dev", "/dev"]
    for node, mode in devices:
        argv += ["--dev-bind" if "w" in mode else "--ro-bind", node, node]
    for key, parent in UNIT_DIRS.items():
        if properties.get(key):
            argv += ["--tmpfs", parent]
            for name in properties[key]:
                argv += ["--bind", str(directories[key]), f"{parent}/{name}"]
            argv += ["--remount-ro", parent]
    return argv


def _privileges(properties: Mapping[str, Sequence[str]], uid: int, gid: int) -> list[str]:
    """prlimit's and setpriv's commands for LimitNOFILE, User=, the capabilities and
    NoNewPrivileges."""
    if _last(properties, "NoNewPrivileges") not in YES or properties.get("CapabilityBoundingSet", []) != []:
        raise UnitError("the sandbox applies NoNewPrivileges=yes with an empty CapabilityBoundingSet=")
    argv = []
    nofile = _last(properties, "LimitNOFILE", "")
    if nofile:  # at most this host's hard limit: a container may not raise it (no CAP_SYS_RESOURCE)
        limit = min(int(nofile), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        argv += ["prlimit", f"--nofile={limit}:{limit}", "--"]
    argv += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    return [*argv, "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"]


def installed_under_tmp(python: str) -> list[Path]:
    """This checkout and the Python environment that runs the agent, where they lie under
    ``/tmp`` or ``/var/tmp`` (a clone made there): a node keeps its Ray environment in
    ``/opt`` or ``/usr``, which ``PrivateTmp`` leaves alone, so they are bound back read-only
    as a node's would be seen, not hidden with the test's ``/tmp``."""
    repo = Path(__file__).resolve().parents[1]
    found: list[Path] = []
    for given in (repo, Path(python).parent.parent, Path(sys.prefix)):
        path = Path(os.path.abspath(given))
        hidden = any(tmp in path.parents for tmp in PRIVATE_TMP)
        if hidden and not any(path.is_relative_to(p) for p in found):
            found.append(path)
    return found


def sandbox_argv(
    properties: Mapping[str, Sequence[str]],
    command: Sequence[str],
    uid: int,
    gid: int,
    directories: Mapping[str, Path],
    spec_file: Path,
    stand_ins: Sequence[Path] = (),
    python: str = sys.executable,
) -> list[str]:
    """``bwrap ... -- prlimit ... -- setpriv ... -- python unit_sandbox.py exec SPEC -- COMMAND``.

    ``directories``: where the unit's ``StateDirectory``/``CacheDirectory`` live on this
    host (bound at ``/var/lib/NAME`` and ``/var/cache/NAME`` inside). ``stand_ins``: the
    test's directories that stand in for what a node keeps outside ``/tmp`` (the single
    file in ``/opt``, the token in ``/etc/rayscope``); bound read-only into a private
    ``/tmp`` (``spec_file`` must be in one of them: this module is copied beside it and run
    there by ``python``, which ``uid`` must be able to run)."""
    check_covered(properties)
    stand_ins = [*stand_ins, *installed_under_tmp(python)]
    argv = ["bwrap", "--die-with-parent", *_mounts(properties, directories, stand_ins), "--"]
    argv += _privileges(properties, uid, gid)
    spec_file.write_text(json.dumps(seccomp_spec(properties)))
    helper = spec_file.with_name("unit_sandbox.py")
    shutil.copyfile(__file__, helper)
    return [*argv, python, "-I", str(helper), "exec", str(spec_file), "--", *command]


def unit_environment(properties: Mapping[str, Sequence[str]], home: str, user: str) -> dict[str, str]:
    """The environment systemd gives the service: its own variables, the unit's
    ``Environment=`` lines, and the directories' ``$STATE_DIRECTORY``/``$CACHE_DIRECTORY``."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/sh",
    }
    for key, parent in UNIT_DIRS.items():
        if properties.get(key):
            env[f"{key.removesuffix('Directory').upper()}_DIRECTORY"] = f"{parent}/{properties[key][0]}"
    for line in properties.get("Environment", []):
        for assignment in line.split():
            name, _, value = assignment.partition("=")
            env[name] = expand(value)
    return env


# -- inside the sandbox: the seccomp filters, then execve --------------------------------

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ = 1, 4, 6, 7
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME."""
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
S_ISUID, S_ISGID, O_CREAT = 0o4000, 0o2000, 0o100
MAX_FAMILY = 63
EPERM = 0x00050000 | 1
"""``SCMP_ACT_ERRNO(EPERM)``."""


def scmp_errno(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


class _Cmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _Filter:
    """One libseccomp filter context: rules, then loaded (each filter is its own, as
    systemd loads one per setting; the kernel runs them all and the strictest answer wins)."""

    def __init__(self, lib: ctypes.CDLL, default: int) -> None:
        self.lib = lib
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_Cmp),
        ]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self.ctx = lib.seccomp_init(ctypes.c_uint32(default))
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        number = self.lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a call of this architecture (libseccomp's pseudo numbers)
            return
        array = (_Cmp * max(1, len(cmps)))(*[_Cmp(*c) for c in cmps])
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, number, len(cmps), array)
        if rc < 0:
            raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

    def load(self) -> None:
        rc = self.lib.seccomp_load(self.ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")


def _families(f: _Filter, allowed: Sequence[int]) -> None:
    for family in range(MAX_FAMILY + 1):
        if family not in allowed:
            f.rule(scmp_errno(97), "socket", (0, SCMP_CMP_EQ, family, 0))  # EAFNOSUPPORT
    f.rule(scmp_errno(97), "socket", (0, SCMP_CMP_GT, MAX_FAMILY, 0))


def _namespaces(f: _Filter) -> None:
    for flag in NAMESPACE_FLAGS:
        for call in ("unshare", "clone"):
            f.rule(EPERM, call, (0, SCMP_CMP_MASKED_EQ, flag, flag))
    f.rule(EPERM, "setns")
    f.rule(scmp_errno(38), "clone3")  # ENOSYS: libc falls back to clone, filtered above


def _write_execute(f: _Filter) -> None:
    both = PROT_WRITE | PROT_EXEC
    f.rule(EPERM, "mmap", (2, SCMP_CMP_MASKED_EQ, both, both))
    for call in ("mprotect", "pkey_mprotect"):
        f.rule(EPERM, call, (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
    f.rule(EPERM, "shmat", (2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))


def _personality(f: _Filter) -> None:
    f.rule(EPERM, "personality", (0, SCMP_CMP_NE, 0, 0))  # PER_LINUX, this process's


def _realtime(f: _Filter) -> None:
    for policy in (1, 2, 6):  # SCHED_FIFO, SCHED_RR, SCHED_DEADLINE
        f.rule(EPERM, "sched_setscheduler", (1, SCMP_CMP_EQ, policy, 0))


def _suid(f: _Filter) -> None:
    for bit in (S_ISUID, S_ISGID):
        for call, arg in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("creat", 1)):
            f.rule(EPERM, call, (arg, SCMP_CMP_MASKED_EQ, bit, bit))
        created = (SCMP_CMP_MASKED_EQ, O_CREAT, O_CREAT)
        f.rule(EPERM, "open", (1, *created), (2, SCMP_CMP_MASKED_EQ, bit, bit))
        f.rule(EPERM, "openat", (2, *created), (3, SCMP_CMP_MASKED_EQ, bit, bit))


def load_filters(spec: Mapping[str, Any]) -> None:
    """The unit's seccomp filters, as systemd's seccomp-util builds them: one per setting,
    each allowing what it does not deny, and the allow list of system calls last (the calls
    that load the others need not be on it)."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    settings: list[tuple[bool, Callable[[_Filter], None]]] = [
        (bool(spec["families"]), lambda f: _families(f, spec["families"])),
        (spec["namespaces"], _namespaces),
        (spec["mdwe"], _write_execute),
        (spec["personality"], _personality),
        (spec["realtime"], _realtime),
        (spec["suid"], _suid),
    ]
    filters = []
    for wanted, build in settings:
        if wanted:
            f = _Filter(lib, SCMP_ACT_ALLOW)
            build(f)
            filters.append(f)
    if spec["allow"]:
        f = _Filter(lib, scmp_errno(spec["errno"]))
        for call in spec["allow"]:
            f.rule(SCMP_ACT_ALLOW, call)
        filters.append(f)
    for f in filters:
        f.load()


def exec_main(argv: Sequence[str]) -> None:
    """``unit_sandbox.py exec SPEC -- COMMAND``: umask and filters, then COMMAND."""
    if len(argv) < 4 or argv[0] != "exec" or argv[2] != "--":
        sys.exit("usage: unit_sandbox.py exec SPEC -- COMMAND...")
    spec = json.loads(Path(argv[1]).read_text())
    os.umask(spec["umask"])
    load_filters(spec)
    command = list(argv[3:])
    os.execvp(command[0], command)


def missing() -> str:
    """What this host lacks to build the sandbox (``""``: nothing)."""
    if os.geteuid() != 0:
        return "needs root (bwrap's mounts without a user namespace, setpriv's uid change)"
    from tests import debian_deps  # here, not at the top: this file also runs alone, copied into the sandbox

    for tool in ("bwrap", "setpriv", "prlimit", "systemd-analyze"):
        why = debian_deps.why_missing(tool)
        if why:
            return why
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return "needs libseccomp.so.2 (Debian's libseccomp2, a dependency of systemd)"
    return ""


if __name__ == "__main__":
    exec_main(sys.argv[1:])
