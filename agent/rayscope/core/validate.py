"""What a head accepts from a node report, and how many nodes it holds (SECURITY.md, rule 4).

A report is judged by the head, never by its own fields: a node that holds the token can
still send anything msgspec decodes. A report the head keeps is

* bounded by what it costs once decoded, not by its bytes on the wire: at most
  :data:`MAX_GPUS` GPUs, :data:`MAX_MIG_DEVICES` MIG devices each (and no deeper nesting),
  :data:`MAX_DEVICES` devices in all, :data:`MAX_PROCESSES_PER_GPU` processes per device and
  :data:`MAX_PROCESSES` in all, :data:`MAX_ITEMS` items in any other list or map,
  :data:`MAX_STRING_CHARS` characters in any string and :data:`MAX_REPORT_CHARS` in all (so a
  report held costs at most ``MAX_REPORT_DECODED_BYTES``);
* made of finite, non-negative numbers (temperatures excepted);
* free of control characters: every string goes through :func:`printable` (escape sequences
  would otherwise reach terminals, log lines and Prometheus labels);
* without what only the head computes (a GPU's ``attribution``).

The numbers and the list lengths are types in ``rayscope.schema.report`` (``Count``, ``Amount``,
``max_length``): the head's msgspec decoder checks them in C and names the field. What types
cannot say is checked here, by :func:`check_report`, once per report at the one place the
head ingests it: MIG nesting, ``attribution``, and the strings. The strings of a report are
gathered by a walker generated per Struct type from its fields (:func:`_gatherer`), then
judged in one pass; only a report that fails it takes the slow path (:func:`_clean_struct`),
which strips control characters in place or raises :class:`ReportError` naming the rule
broken. The connection counts a rejection in ``frames_rejected`` and logs why.

Staleness is the head's business too: a report's own ``interval_s`` is informational.

How many nodes the head holds, and who may report each: :mod:`rayscope.head.store.reports`.
"""

import functools
import math
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from rayscope.labels import printable
from rayscope.schema.report import (
    MAX_DEVICES,
    MAX_GPUS,
    MAX_ITEMS,
    MAX_MIG_DEVICES,
    MAX_PROCESSES,
    MAX_PROCESSES_PER_GPU,
    MAX_REPORT_CHARS,
    NodeReport,
)

__all__ = [  # the bounds live in the schema; named here for the checks below
    "MAX_DEVICES",
    "MAX_GPUS",
    "MAX_ITEMS",
    "MAX_MIG_DEVICES",
    "MAX_PROCESSES",
    "MAX_PROCESSES_PER_GPU",
]

MAX_STRING_CHARS = 4096
"""Paths (a session directory, a Python) are the longest strings; Linux's PATH_MAX is 4096."""
SIGNED_FIELDS = frozenset({"temperature_c"})


class ReportError(Exception):
    """A frame that authenticated but does not hold a report this head accepts; ``reason``
    is the short word the agent is told and ``/healthz`` counts (``bad report``, or the
    report table's ``claimed``, ``wrong peer``, ``full``)."""

    def __init__(self, message: str, reason: str = "bad report") -> None:
        super().__init__(message)
        self.reason = reason


def check_report(report: NodeReport) -> None:
    """What the decoder's types do not check (see the module's docstring); strips control
    characters in place; :class:`ReportError` names the first rule broken."""
    devices = processes = 0
    for gpu in report.gpus or ():
        for device in (gpu, *gpu.mig_devices):
            if device is not gpu and device.mig_devices:
                raise ReportError("MIG devices nested inside a MIG device")
            if device.attribution is not None:
                raise ReportError("a GPU's attribution is set (only the head computes it)")
            devices += 1
            processes += len(device.processes or ())
    if devices > MAX_DEVICES:
        raise ReportError(f"{devices} GPUs and MIG devices (at most {MAX_DEVICES} in a report)")
    if processes > MAX_PROCESSES:
        raise ReportError(f"{processes} GPU processes (at most {MAX_PROCESSES} in a report)")
    strings: list[Any] = []
    _gatherer(NodeReport)(report, strings)
    if not _strings_ok(strings):
        chars = sum(len(s) for s in strings if isinstance(s, str))
        if chars > MAX_REPORT_CHARS:
            raise ReportError(f"{chars} characters in its strings (at most {MAX_REPORT_CHARS} in a report)")
        _clean_struct(report, "report")


Gather = Callable[[Any, list[Any]], None]
"""Appends every string a value holds (``None`` and empty ones too) to the list."""


def _unwrap(kind: Any) -> Any:
    """``Optional[X]`` → ``X``; any other type unchanged."""
    if isinstance(kind, mi.UnionType):
        inner = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        if len(inner) == 1:
            return inner[0]
    return kind


def _holds_strings(kind: Any, seen: frozenset[type] = frozenset()) -> bool:
    """Whether a value of type ``kind`` can hold a string (a Struct met again: assume so)."""
    kind = _unwrap(kind)
    if isinstance(kind, mi.StrType):
        return True
    if isinstance(kind, mi.StructType):
        return kind.cls in seen or any(
            _holds_strings(f.type, seen | {kind.cls})
            for f in mi.type_info(kind.cls).fields  # type: ignore[attr-defined]
        )
    if isinstance(kind, mi.ListType):
        return _holds_strings(kind.item_type, seen)
    if isinstance(kind, mi.DictType):
        return _holds_strings(kind.key_type, seen) or _holds_strings(kind.value_type, seen)
    if isinstance(kind, (mi.IntType, mi.FloatType, mi.BoolType, mi.NoneType)):
        return False
    raise TypeError(f"validate does not know where the strings are in a {kind!r}")


_WALKERS: dict[str, Any] = {}
"""The generated walkers by name (their globals too: a walker calls a nested Struct's by name)."""


def _walker_name(cls: type) -> str:
    return f"gather_{cls.__name__}_{id(cls):x}"


def _field_lines(name: str, kind: Any) -> list[str]:
    """The walker's lines for a field ``name`` of type ``kind`` that is not a string itself
    (none when it cannot hold one); field names are the schema's identifiers, never input."""
    kind = _unwrap(kind)
    if not _holds_strings(kind):
        return []
    if isinstance(kind, mi.StructType):
        return [
            f"    item = value.{name}",
            "    if item is not None:",
            f"        {_compiled(kind.cls)}(item, out)",
        ]
    if isinstance(kind, mi.ListType):
        item_kind = _unwrap(kind.item_type)
        if isinstance(item_kind, mi.StrType):
            return [f"    out.extend(value.{name} or ())"]
        if not isinstance(item_kind, mi.StructType):
            raise TypeError(f"validate does not know where the strings are in {name}: {kind!r}")
        walker = _compiled(item_kind.cls)
        return [f"    for item in value.{name} or ():", f"        {walker}(item, out)"]
    if isinstance(kind, mi.DictType):
        keys = isinstance(_unwrap(kind.key_type), mi.StrType)
        values = isinstance(_unwrap(kind.value_type), mi.StrType)
        if _holds_strings(kind.value_type) and not values:
            raise TypeError(f"validate does not know where the strings are in {name}: {kind!r}")
        lines = [f"    mapping = value.{name}", "    if mapping:"]
        lines += ["        out.extend(mapping)"] if keys else []
        lines += ["        out.extend(mapping.values())"] if values else []
        return lines
    raise TypeError(f"validate does not know where the strings are in {name}: {kind!r}")


def _compiled(cls: type) -> str:
    """The name of ``cls``'s walker in :data:`_WALKERS`, generated on first use."""
    name = _walker_name(cls)
    if name in _WALKERS:
        return name
    _WALKERS[name] = None  # a Struct that holds its own type (MIG devices) refers to itself
    fields = mi.type_info(cls).fields  # type: ignore[attr-defined]
    own = [f.name for f in fields if isinstance(_unwrap(f.type), mi.StrType)]
    lines = [f"def {name}(value, out):"]
    if own:
        lines.append(f"    out.extend(({', '.join(f'value.{n}' for n in own)},))")
    for f in fields:
        if not isinstance(_unwrap(f.type), mi.StrType):
            lines += _field_lines(f.name, f.type)
    lines.append("    return None")
    exec("\n".join(lines), _WALKERS)  # code built from our own Struct types, never from input
    return name


@functools.cache
def _gatherer(cls: type) -> Gather:
    """The strings walker of one Struct type, generated once from its fields as one plain
    function (as ``dataclasses`` generates ``__init__``): its own strings, then a loop or a
    call per field that can hold more. A walker of closures per field cost ~5 µs of the
    ~9 µs a report's check took; generated, the same walk costs about half."""
    walker: Gather = _WALKERS[_compiled(cls)]
    return walker


def _strings_ok(values: list[Any]) -> bool:
    strings = [s for s in values if s]
    try:
        return not strings or (
            max(map(len, strings)) <= MAX_STRING_CHARS
            and sum(map(len, strings)) <= MAX_REPORT_CHARS
            and "".join(strings).isprintable()
        )
    except TypeError:  # not all strings: the slow path says which
        return False


def _clean_struct(value: msgspec.Struct, where: str) -> None:
    for name in value.__struct_fields__:
        item = getattr(value, name)
        cleaned = _clean(item, f"{where}.{name}", name in SIGNED_FIELDS)
        if cleaned is not item:
            setattr(value, name, cleaned)


def _clean(value: Any, where: str, signed: bool = False) -> Any:
    """``value`` checked, with control characters stripped: the same object if unchanged."""
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise ReportError(f"{where}: a string of {len(value)} characters (at most {MAX_STRING_CHARS})")
        cleaned = printable(value)
        return value if cleaned == value else cleaned
    if isinstance(value, (bool, msgspec.UnsetType)) or value is None:
        return value
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or (value < 0 and not signed):
            raise ReportError(
                f"{where}: {value!r} is not a finite{'' if signed else ', non-negative'} number"
            )
        return value
    if isinstance(value, msgspec.Struct):
        _clean_struct(value, where)
        return value
    if isinstance(value, list):
        return _clean_list(value, where)
    if isinstance(value, dict):
        return _clean_dict(value, where)
    raise ReportError(f"{where}: unexpected {type(value).__name__}")


def _clean_list(value: list[Any], where: str) -> list[Any]:
    if len(value) > MAX_ITEMS:
        raise ReportError(f"{where}: {len(value)} items (at most {MAX_ITEMS})")
    items = [_clean(v, where) for v in value]
    return value if all(a is b for a, b in zip(items, value)) else items


def _clean_dict(value: dict[Any, Any], where: str) -> dict[Any, Any]:
    if len(value) > MAX_ITEMS:
        raise ReportError(f"{where}: {len(value)} entries (at most {MAX_ITEMS})")
    pairs = [(_clean(k, where), _clean(v, where)) for k, v in value.items()]
    return value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
