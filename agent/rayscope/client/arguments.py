"""The Python API's one argument check (docs/api.md): every argument of every public call is
checked here, first, for its type, length, NUL characters, finiteness and range, and a bad
one is a :class:`RayscopeError` (a usage error, exit 2) whose one line names it
(``timeout=nan: not a finite number: ...``), before anything is read.

The command line's options are checked by click and :mod:`rayscope.core.limits`; a program
can pass anything, and what it passed used to go on to code that assumed a string or a float:
``gcs=6379`` ended in ``AttributeError`` (exit 70), ``timeout=10**400`` in ``OverflowError``,
a host with a NUL or of 100,000 characters went on to the read, and a shape given as a list
of pairs was placed as if it were a dict. What a value means (an address, a resource name, a
selector) is still judged by the command line's own parsers; this module makes sure they get
a value of the kind they parse, and names the argument when they refuse it.
"""

import math
import numbers
import os
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar, Union

from rayscope.core import limits
from rayscope.errors import EXIT_USAGE, RayscopeError

T = TypeVar("T")

MAX_ADDRESS_CHARS = 2048
"""An address or URL (``HOST:PORT``, ``http://HOST:PORT/prefix``): the dashboard URL's cap."""
MAX_PATH_CHARS = 4096
"""A file's path: Linux's ``PATH_MAX``."""
MAX_NAME_CHARS = 512
"""A Ray resource name or a label key (Ray's label key: a 253-character prefix and a
63-character name)."""
MAX_VALUE_CHARS = 4096
"""A label selector's value (``in(a,b,...)``)."""
MAX_WINDOW_CHARS = 64
"""A usage window's text (``30m``)."""
MAX_ENTRIES = 64
"""Resources in a shape, labels in a selector."""
NUL = "\x00"
_EXACT = 1 << 53
"""Past this an integer is not a float exactly, and past every range the API takes."""


def window_limit() -> limits.Limit:
    """``usage``'s ``window=`` as seconds: more than 0, at most the longest window a head
    keeps (:func:`rayscope.core.usage.summary.parse_window`'s range)."""
    from rayscope.core.usage.summary import MAX_WINDOW_S  # here: only usage() pays its imports

    return limits.Limit("seconds", 0.0, MAX_WINDOW_S, low_included=False)


def usage(message: str) -> RayscopeError:
    """A bad argument: :class:`RayscopeError`, exit 2."""
    return RayscopeError(message, EXIT_USAGE)


def shown(value: object) -> str:
    """``value`` as the message quotes it: its ``repr`` cut to 40 characters (an integer of
    40 digits or more: its size in bits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"<an integer of {abs(value).bit_length():,} bits>"  # str() of 5,000 digits raises
    try:
        text = repr(value)
    except Exception:  # a caller's object whose repr fails
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _a(value: object) -> str:
    """``an int``, ``a bytes``: the value's type with its article."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def text(name: str, value: object, max_chars: int, *, path: bool = False) -> Optional[str]:
    """``value`` if it is a string a parser can take: a ``str`` (``path``: or an
    ``os.PathLike`` of one), not blank, at most ``max_chars`` long, without NUL; ``None``
    for ``None``."""
    if value is None:
        return None
    if path and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise usage(f"{name}={shown(value)}: {_a(value)}, not a str")
    if not value.strip():
        raise usage(f"{name}={shown(value)}: empty (give None for the default)")
    if len(value) > max_chars:
        raise usage(f"{name}=: {len(value):,} characters, more than the {max_chars:,} it takes")
    if NUL in value:
        raise usage(f"{name}={shown(value)}: holds a NUL character")
    return value


def number(name: str, value: object, limit: limits.Limit) -> Union[int, float]:
    """``value`` if it is a number (``int``, ``float`` or another real number, never a
    ``bool``) that ``limit`` takes: finite, whole where it counts, in its range (checked by
    :func:`rayscope.core.limits.check`, as the command line checks its option)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise usage(f"{name}={shown(value)}: {_a(value)}, not a number: {limits.wanted(limit)}")
    if isinstance(value, numbers.Integral) and abs(int(value)) > _EXACT:
        raise usage(f"{name}={shown(value)}: {limits.wanted(limit)}")
    try:
        amount = float(value)
    except (OverflowError, ValueError):
        raise usage(f"{name}={shown(value)}: not a finite number: {limits.wanted(limit)}") from None
    try:
        return limits.check(name, amount, limit)
    except ValueError as err:  # "NAME VALUE: why": the value shown as given, after "="
        raise usage(f"{name}={shown(value)}: {str(err).partition(': ')[2]}") from None


def amount(value: object) -> float:
    """A finite number (never a ``bool``): a resource amount, whose range its parser judges;
    ``ValueError`` saying why not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{shown(value)} is {_a(value)}, not a number")
    if isinstance(value, numbers.Integral) and abs(int(value)) > _EXACT:
        raise ValueError(f"{shown(value)} is too large")
    try:
        result = float(value)
    except (OverflowError, ValueError):
        result = math.nan
    if not math.isfinite(result):
        raise ValueError(f"{shown(value)} is not a finite number")
    return result


def label_value(value: object) -> str:
    """A label selector's value: a ``str`` without NUL, at most :data:`MAX_VALUE_CHARS`;
    ``ValueError`` saying why not."""
    if not isinstance(value, str):
        raise ValueError(f"{shown(value)} is {_a(value)}, not a str")
    if len(value) > MAX_VALUE_CHARS:
        raise ValueError(f"a value of {len(value):,} characters, more than the {MAX_VALUE_CHARS:,} it takes")
    if NUL in value:
        raise ValueError(f"{shown(value)} holds a NUL character")
    return value


def mapping(name: str, value: object, entry: Callable[[object], T], example: str) -> dict[str, T]:
    """``value`` if it is a mapping (a ``dict``, not a list of pairs) of at most
    :data:`MAX_ENTRIES` keys, each a ``str`` of 1 to :data:`MAX_NAME_CHARS` characters
    without NUL, its values checked by ``entry`` (``ValueError``: why not)."""
    if not isinstance(value, Mapping):
        raise usage(f"{name}={shown(value)}: {_a(value)}, not a dict: give {example}")
    if len(value) > MAX_ENTRIES:
        raise usage(f"{name}=: {len(value):,} entries, more than the {MAX_ENTRIES} it takes")
    checked: dict[str, T] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise usage(f"{name}=: the key {shown(key)} is {_a(key)}, not a str: give {example}")
        if not key or len(key) > MAX_NAME_CHARS or NUL in key:
            why = "holds a NUL character" if NUL in key else f"is not 1 to {MAX_NAME_CHARS} characters"
            raise usage(f"{name}=: the key {shown(key)} {why}")
        try:
            checked[key] = entry(item)
        except ValueError as err:
            raise usage(f"{name}=: {shown(key)}: {err}") from None
    return checked
