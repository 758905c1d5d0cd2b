"""What a head accepts from a node report, and how many nodes it holds (SECURITY.md, rule 4).

A report is judged by the head, never by its own fields: a node that holds the token can
still send anything msgspec decodes. :func:`check_report` runs once per report, at the one
place the head ingests it, and either raises :class:`ReportError` (the connection counts the
rejection in ``frames_rejected`` and logs why) or leaves a report that is

* bounded: at most :data:`MAX_GPUS` devices, :data:`MAX_MIG_DEVICES` MIG devices each (and no
  deeper nesting), :data:`MAX_PROCESSES_PER_GPU` processes per device, :data:`MAX_ITEMS` items
  in any other list or map, :data:`MAX_STRING_CHARS` characters in any string;
* made of finite, non-negative numbers (temperatures excepted: finite);
* free of control characters: every string goes through :func:`printable` (escape sequences
  would otherwise reach terminals, log lines and Prometheus labels);
* without what only the head computes (a GPU's ``attribution``).

Staleness is the head's business too: a report's own ``interval_s`` is informational.

Nodes held: at most :data:`MAX_NODES_HELD` reports. :func:`make_room` says which to drop for a
new node: the report received longest ago among nodes the scheduler does not know. Reports of
nodes the scheduler knows are never evicted (the scheduler bounds their number); when only
they are held, a report from yet another unknown node is rejected.
"""

import functools
import math
import operator
import re
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any, NamedTuple, Optional

import msgspec
import msgspec.inspect

from agent.model import NodeReport, ReceivedReport

MAX_GPUS = 64
MAX_MIG_DEVICES = 16
"""NVIDIA's largest MIG split is 7 instances; 16 leaves room."""
MAX_PROCESSES_PER_GPU = 256
MAX_ITEMS = 4096
"""Any other list or map: sources, a raylet's resources and labels, the process table."""
MAX_STRING_CHARS = 4096
"""Paths (a session directory, a Python) are the longest strings; Linux's PATH_MAX is 4096."""
MAX_NODES_HELD = 16_384
SIGNED_FIELDS = frozenset({"temperature_c"})

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


class ReportError(Exception):
    """A frame that authenticated but does not hold a report this head accepts."""


def printable(text: str) -> str:
    """``text`` without control characters (C0, DEL, C1) or bidirectional overrides: what a
    terminal, a log line or a Prometheus label may show."""
    return text if text.isprintable() else _CONTROL.sub("", text)


def printable_lines(lines: list[str]) -> list[str]:
    return [printable(line) for line in lines]


def check_report(report: NodeReport) -> None:
    """Bounds, numbers and strings of one decoded report (see the module's docstring);
    strips control characters in place; :class:`ReportError` names the first rule broken."""
    gpus = report.gpus or []
    if len(gpus) > MAX_GPUS:
        raise ReportError(f"{len(gpus)} GPUs in one report (at most {MAX_GPUS})")
    for gpu in gpus:
        if len(gpu.mig_devices) > MAX_MIG_DEVICES:
            raise ReportError(f"{len(gpu.mig_devices)} MIG devices on one GPU (at most {MAX_MIG_DEVICES})")
        for device in [gpu, *gpu.mig_devices]:
            if device is not gpu and device.mig_devices:
                raise ReportError("MIG devices nested inside a MIG device")
            if device.processes is not None and len(device.processes) > MAX_PROCESSES_PER_GPU:
                raise ReportError(
                    f"{len(device.processes)} processes on one GPU (at most {MAX_PROCESSES_PER_GPU})"
                )
            if device.attribution is not None:
                raise ReportError("a GPU's attribution is set (only the head computes it)")
    _check_struct(report, "report")


class _Plan(NamedTuple):
    """One Struct type's fields by kind, read with one ``attrgetter`` call per kind."""

    strings: Optional[Callable[[Any], tuple[Any, ...]]]
    numbers: Optional[Callable[[Any], tuple[Any, ...]]]
    signed: tuple[str, ...]
    nested: tuple[str, ...]


def _getter(names: list[str]) -> Optional[Callable[[Any], tuple[Any, ...]]]:
    if not names:
        return None
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda value: (get(value),)


@functools.cache
def _plan(cls: type) -> _Plan:
    strings: list[str] = []
    numbers: list[str] = []
    signed: list[str] = []
    nested: list[str] = []
    for field in msgspec.inspect.type_info(cls).fields:  # type: ignore[attr-defined]
        kind = field.type
        if isinstance(kind, msgspec.inspect.UnionType):
            inner = [t for t in kind.types if not isinstance(t, msgspec.inspect.NoneType)]
            kind = inner[0] if len(inner) == 1 else kind
        if isinstance(kind, msgspec.inspect.StrType):
            strings.append(field.name)
        elif isinstance(kind, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
            (signed if field.name in SIGNED_FIELDS else numbers).append(field.name)
        elif not isinstance(kind, msgspec.inspect.BoolType):
            nested.append(field.name)
    return _Plan(_getter(strings), _getter(numbers), tuple(signed), tuple(nested))


def _strings_ok(values: Iterable[Any]) -> bool:
    strings = [s for s in values if s]
    try:
        return not strings or (max(map(len, strings)) <= MAX_STRING_CHARS and "".join(strings).isprintable())
    except TypeError:  # not all strings: the slow path says which
        return False


def _numbers_ok(values: Iterable[Any]) -> bool:
    numbers = [x for x in values if x is not None]
    try:
        return not numbers or (min(numbers) >= 0 and math.isfinite(math.fsum(numbers)))
    except (TypeError, ValueError, OverflowError):  # inf - inf, or not all numbers
        return False


def _scalars_ok(values: Iterable[Any]) -> bool:
    items = tuple(values)
    return not items or (_strings_ok(items) if isinstance(items[0], str) else _numbers_ok(items))


def _check_struct(value: msgspec.Struct, where: str) -> None:
    """The fast path: each kind of field checked in one pass of C-level calls; anything it
    does not pass goes to :func:`_clean_struct`, which names the rule broken or cleans."""
    plan = _plan(type(value))
    if (plan.strings is not None and not _strings_ok(plan.strings(value))) or (
        plan.numbers is not None and not _numbers_ok(plan.numbers(value))
    ):
        _clean_struct(value, where)
        return
    for name in plan.signed:
        number = getattr(value, name)
        if number is not None and not math.isfinite(number):
            raise ReportError(f"{where}.{name}: {number!r} is not a finite number")
    for name in plan.nested:
        _check_nested(value, name, f"{where}.{name}")


def _check_nested(value: msgspec.Struct, name: str, where: str) -> None:
    """A list, map or Struct field: Structs on the fast path, lists and maps of scalars in
    one pass, anything else (or anything that fails) through :func:`_clean`."""
    item = getattr(value, name)
    if item is None:
        return
    if isinstance(item, msgspec.Struct):
        _check_struct(item, where)
        return
    if isinstance(item, (list, dict)) and len(item) > MAX_ITEMS:
        raise ReportError(f"{where}: {len(item)} items (at most {MAX_ITEMS})")
    if isinstance(item, list) and item and isinstance(item[0], msgspec.Struct):
        for element in item:
            _check_struct(element, where)
        return
    if isinstance(item, list) and _scalars_ok(item):
        return
    if isinstance(item, dict) and _scalars_ok(item.keys()) and _scalars_ok(item.values()):
        return
    cleaned = _clean(item, where)
    if cleaned is not item:
        setattr(value, name, cleaned)


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
    if isinstance(value, bool) or value is None:
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
        if len(value) > MAX_ITEMS:
            raise ReportError(f"{where}: {len(value)} items (at most {MAX_ITEMS})")
        items = [_clean(v, where) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise ReportError(f"{where}: {len(value)} entries (at most {MAX_ITEMS})")
        pairs = [(_clean(k, where), _clean(v, where)) for k, v in value.items()]
        return (
            value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
        )
    raise ReportError(f"{where}: unexpected {type(value).__name__}")


def make_room(reports: Mapping[str, ReceivedReport], known: Container[str], key: str) -> Optional[str]:
    """The node whose report to drop so that ``key``'s can be held (``None``: nothing to
    drop); :class:`ReportError` when the table holds only nodes the scheduler knows."""
    if key in reports or len(reports) < MAX_NODES_HELD:
        return None
    oldest = _oldest_unknown(reports, known)
    if oldest is None and key not in known:
        raise ReportError(f"the head holds {len(reports)} nodes the scheduler knows, the most it holds: full")
    return oldest


def _oldest_unknown(reports: Mapping[str, ReceivedReport], known: Container[str]) -> Optional[str]:
    unknown = [(r.received_at, k) for k, r in reports.items() if k not in known]
    return min(unknown)[1] if unknown else None
