"""Shared libraries loaded from trusted paths only (SECURITY.md, *Local trust*).

pynvml loads ``libnvidia-ml.so.1`` by name, and the CUDA sample's child loaded
``libcuda.so.1`` the same way. A name is searched along ``LD_LIBRARY_PATH`` as the dynamic
loader read it when the process started, so changing ``os.environ`` later changes nothing for
this process. An empty element (``ENV X=/a:$X`` with ``X`` unset leaves ``/a:``) or a relative
one is the working directory: root running ``node`` or ``push`` from a world-writable
directory loaded another user's library there, and its constructor ran as root.

So rayscope finds the file itself, in the loader's order: the trusted elements of
``LD_LIBRARY_PATH``, the loader's cache (``/etc/ld.so.cache``), the system directories; and
loads it by its absolute path. An element counts only when it is absolute and it and every
directory from ``/`` down to it are root's or the user's and not writable by group or others
(:func:`rayscope.sources.trust.open_trusted`), a file only when it passes the same rule. A file
built for another ELF class or machine is passed over, as the loader passes it over. When no
trusted file is found, the plain name is loaded only if nothing was refused (the loader's own
search then reaches nothing this one refused), else :class:`NotFound` names what was refused.
The library's own dependencies (its ``DT_NEEDED`` entries: ``libpthread.so.0``, ``librt.so.1``
for NVIDIA's) are found and loaded the same way first, since the loader would search for
those by name too; it then finds each one loaded already (by its soname) and searches nothing.
Children get ``LD_LIBRARY_PATH`` cut to its trusted elements (:func:`child_search_path`).
"""

import ctypes
import functools
import os
import struct
import sysconfig
from collections.abc import Mapping
from typing import NamedTuple, Optional

from rayscope.sources import trust

LOADER_CACHE = "/etc/ld.so.cache"
MAX_CACHE_BYTES = 16 * 1024 * 1024
"""The loader's cache is some tens of KiB (560 libraries: 36 KiB); a larger file is not read."""
_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
_CACHE_COUNTS = struct.Struct("=II")  # number of entries, size of the string table
_CACHE_ENTRY = struct.Struct("=iIIIQ")  # flags, key (soname), value (path), os version, hwcap
_CACHE_ENTRIES_AT = 48  # magic (20), counts (8), flags and padding (4), extension offset, unused
_ELF_MAGIC = b"\x7fELF"
MAX_DEPENDENCIES = 64
"""Libraries loaded for one, its dependencies' dependencies included (NVML needs 5)."""
_SHT_DYNAMIC = 6
_DT_NEEDED = 1


class SearchPath(NamedTuple):
    """``LD_LIBRARY_PATH`` as rayscope searches it."""

    directories: list[str]
    """Its absolute elements whose directory chain is trusted, in order, each once."""
    refused: list[str]
    """Each element left out, and why (a sentence)."""


class Resolution(NamedTuple):
    """Where a library is, as :func:`resolve` found it."""

    path: Optional[str]
    """The absolute path of the first trusted file, or ``None``."""
    refused: list[str]
    """What the loader would have searched but rayscope did not take, and why."""

    @property
    def clean(self) -> bool:
        """Whether nothing was refused: the loader's own search by name is then safe."""
        return not self.refused


class NotFound(Exception):
    """No trusted file holds the library, and loading it by name could reach a refused one;
    ``str()`` says what was refused."""


def search_path(environ: Mapping[str, str], me: Optional[int] = None) -> SearchPath:
    """The trusted elements of ``environ``'s ``LD_LIBRARY_PATH`` and the refused ones.

    A missing directory is left out quietly (the loader skips it too; kept, another user
    could create it later under a directory they can write)."""
    me = os.geteuid() if me is None else me
    directories: list[str] = []
    refused: list[str] = []
    value = environ.get("LD_LIBRARY_PATH", "")
    for element in value.split(":") if value else []:
        if not element:
            refused.append("the empty element of LD_LIBRARY_PATH (the working directory)")
        elif not os.path.isabs(element):
            refused.append(f"the relative element {element} of LD_LIBRARY_PATH")
        elif element not in directories:
            try:
                os.close(trust.open_trusted(element, me, directory=True))
            except trust.Refused as err:
                refused.append(str(err))
            except OSError:
                pass
            else:
                directories.append(element)
    return SearchPath(directories, list(dict.fromkeys(refused)))


def child_search_path(environ: Mapping[str, str]) -> Optional[str]:
    """``LD_LIBRARY_PATH`` for a child process: the trusted elements only; ``None``: none."""
    return ":".join(search_path(environ).directories) or None


def parse_loader_cache(data: bytes) -> list[tuple[str, str]]:
    """The (soname, path) entries of an ``ld.so.cache`` in glibc's format (alone or after the
    old ``ld.so-1.7.0`` part), in the cache's order; nothing when ``data`` is not one."""
    start = data.find(_CACHE_MAGIC)
    if start < 0 or len(data) < start + _CACHE_ENTRIES_AT:
        return []
    count, _strings = _CACHE_COUNTS.unpack_from(data, start + len(_CACHE_MAGIC))
    entries: list[tuple[str, str]] = []
    for index in range(count):
        at = start + _CACHE_ENTRIES_AT + index * _CACHE_ENTRY.size
        if at + _CACHE_ENTRY.size > len(data):
            return []
        _flags, key, value, _os, _hwcap = _CACHE_ENTRY.unpack_from(data, at)
        name, path = _cache_string(data, start + key), _cache_string(data, start + value)
        if name is None or path is None:
            return []
        entries.append((name, path))
    return entries


def _cache_string(data: bytes, at: int) -> Optional[str]:
    end = data.find(b"\0", at)
    if at >= len(data) or end < 0:
        return None
    return data[at:end].decode("utf-8", "replace")


def system_directories() -> list[str]:
    """The loader's own directories, searched after its cache (Debian's multiarch first)."""
    multiarch = sysconfig.get_config_var("MULTIARCH")
    first = [f"/lib/{multiarch}", f"/usr/lib/{multiarch}"] if multiarch else []
    return [*first, "/lib64", "/usr/lib64", "/lib", "/usr/lib"]


def _cached_paths(soname: str, me: int, refused: list[str]) -> list[str]:
    try:
        fd = trust.open_trusted(LOADER_CACHE, me)
    except trust.Refused as err:
        refused.append(str(err))
        return []
    except OSError:
        return []
    with os.fdopen(fd, "rb") as cache:
        data = cache.read(MAX_CACHE_BYTES + 1)
    if len(data) > MAX_CACHE_BYTES:
        return []
    return [path for name, path in parse_loader_cache(data) if name == soname]


def _elf_kind(header: bytes) -> Optional[tuple[int, int, bytes]]:
    """(class, data encoding, machine) of an ELF header; ``None`` when it is none."""
    if len(header) < 20 or not header.startswith(_ELF_MAGIC):
        return None
    return header[4], header[5], header[18:20]


@functools.lru_cache(maxsize=1)
def _own_kind() -> Optional[tuple[int, int, bytes]]:
    try:
        with open("/proc/self/exe", "rb") as exe:
            return _elf_kind(exe.read(20))
    except OSError:
        return None


def resolve(soname: str, environ: Mapping[str, str], *, me: Optional[int] = None) -> Resolution:
    """The first trusted ``soname`` in the loader's order (see the module's docstring)."""
    me = os.geteuid() if me is None else me
    path = search_path(environ, me)
    refused = list(path.refused)
    candidates = [os.path.join(d, soname) for d in path.directories]
    candidates += _cached_paths(soname, me, refused)
    candidates += [os.path.join(d, soname) for d in system_directories()]
    for candidate in dict.fromkeys(candidates):
        try:
            fd = trust.open_trusted(candidate, me)
        except trust.Refused as err:
            refused.append(f"refused {candidate}: {err}")
            continue
        except OSError:
            continue
        with os.fdopen(fd, "rb") as library:
            kind = _elf_kind(library.read(20))
        if kind is not None and _own_kind() is not None and kind != _own_kind():
            continue  # another class or machine: the loader passes it over too
        return Resolution(candidate, refused)
    return Resolution(None, refused)


def needed(path: str) -> list[str]:
    """The sonames ``path`` (an ELF shared object) names as ``DT_NEEDED``, in order; none
    when it is not one this parser reads (the section headers of its ``.dynamic``)."""
    try:
        with open(path, "rb") as library:
            return _needed(library.fileno())
    except (OSError, ValueError, struct.error):
        return []


def _needed(fd: int) -> list[str]:
    header = os.pread(fd, 64, 0)
    if not header.startswith(_ELF_MAGIC) or header[4] not in (1, 2) or header[5] not in (1, 2):
        return []
    wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
    shoff = struct.unpack_from(order + ("Q" if wide else "I"), header, 0x28 if wide else 0x20)[0]
    size, count = struct.unpack_from(order + "HH", header, 0x3A if wide else 0x2E)
    section = struct.Struct(order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
    table = os.pread(fd, size * count, shoff)
    sections = [section.unpack_from(table, i * size) for i in range(count)]
    entry = struct.Struct(order + ("qQ" if wide else "iI"))
    names: list[str] = []
    for _name, kind, _flags, _addr, offset, length, link, *_ in sections:
        if kind != _SHT_DYNAMIC or link >= len(sections):
            continue
        strings = os.pread(fd, sections[link][5], sections[link][4])
        dynamic = os.pread(fd, length, offset)
        for i in range(len(dynamic) // entry.size):
            tag, value = entry.unpack_from(dynamic, i * entry.size)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                names.append(strings[value : strings.index(b"\0", value)].decode("utf-8", "replace"))
    return names


def load(soname: str, environ: Optional[Mapping[str, str]] = None) -> ctypes.CDLL:
    """``soname`` loaded from its trusted absolute path, its dependencies first (each by name
    only when nothing was refused). :class:`NotFound` when no trusted file holds one of them
    but something was refused; ``OSError`` when a file found does not load (or a name is not
    found)."""
    return _load(soname, os.environ if environ is None else environ, {soname})


def _load(soname: str, environ: Mapping[str, str], seen: set[str]) -> ctypes.CDLL:
    found = resolve(soname, environ)
    if found.path is None:
        if found.clean:
            return ctypes.CDLL(soname)
        raise NotFound("; ".join(found.refused))
    for dependency in needed(found.path):
        if dependency not in seen and len(seen) < MAX_DEPENDENCIES:
            seen.add(dependency)
            _load(dependency, environ, seen)
    return ctypes.CDLL(found.path)
