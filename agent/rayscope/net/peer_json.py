"""The one decoder of JSON another process wrote (Ray's dashboard, a head agent's answers and
headers, the head's state file, the GCS and CUDA children, a raylet's ``--labels``): bounded in
nesting as well as in size, and every way it fails is one exception, :class:`PeerJsonError`,
with a one-line reason, which the caller turns into that peer's failure.

Why a bound on nesting: msgspec and Python's ``json`` recurse once per ``[`` or ``{``, even
through a field nobody reads, and at about 1,000 levels raise ``RecursionError`` (a 2 KB
answer), which no caller expected: ``status`` exited 70. Where exactly they give up depends on
how deep the caller's own stack is; :data:`MAX_DEPTH` does not. Before any decoding,
:func:`check_depth` measures how deep the text nests outside its strings (C-speed byte
operations, no Python loop per character) and refuses it beyond :data:`MAX_DEPTH`.
"""

import json
import re
from itertools import accumulate, chain
from operator import sub
from typing import Any, Generic, TypeVar, Union

import msgspec

from rayscope.labels import printable

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects decoded. rayscope's own documents nest 8 levels
(``status --json --gpus``: node, GPU, process, …), Ray's node summary about as many; 64 leaves
room for any field a new release adds, and stays far below the interpreter's recursion limit
(1,000): a caller under 900 frames deep decodes what passes. What is refused does not depend
on the caller's stack."""
MAX_REASON = 200
"""The longest reason a :class:`PeerJsonError` gives (the decoder's message, cut)."""
SHRINK = 8
"""Innermost pairs are stripped by ``bytes.replace`` (one C pass, one level) while a pass
takes at least 1/``SHRINK`` of what is left; then the runs that remain are summed (Python's
iterators, per run). Whatever the shape, the passes cost at most ``SHRINK`` times the brackets
and the runs left are at most 1/``SHRINK`` of them: 16 MiB of brackets alone, shaped to cost
the most, took 0.05-0.4 s on 2 loaded cores; a 152 MiB summary of 16,384 Ray nodes 0.5 s, which
msgspec decodes untyped in 1.8 s (tests/test_peer_json.py bounds it)."""

Data = Union[bytes, bytearray, memoryview, str, msgspec.Raw]
T = TypeVar("T")

_MARKS = b'[]{}"'
_NOT_ESCAPES = bytes(b for b in range(256) if b not in _MARKS + b"\\/bfnrtu")
"""All but the marks, a backslash and what JSON lets follow one: deleted first, in one C pass,
where the text has a backslash (the replaces then run over the little that is left)."""
_NOT_MARKS = bytes(b for b in range(256) if b not in _MARKS)
_SQUARE = bytes.maketrans(b"{}", b"[]")
_RUN = re.compile(rb"\[+|\]+")
_NOT_JSON = re.compile(rb"([:,\[]\s*)(?:NaN|-?Infinity)(?=\s*[,\]}])")
"""A value Python's ``json.dumps`` writes that JSON has not (``NaN``, ``Infinity``, ``-Infinity``)."""


class PeerJsonError(ValueError):
    """JSON a peer sent that is not decoded; ``str()`` is the one-line reason."""


def _as_bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    return data if isinstance(data, bytes) else bytes(data)


def depth(data: Data) -> int:
    """How deep ``data`` nests arrays and objects outside its strings, as a decoder reading it
    from the start would descend (at most that: an upper bound where brackets do not pair);
    0 for a scalar. Never decodes, never recurses."""
    text = _as_bytes(data)
    if b"\\" in text:  # an escaped backslash, then an escaped quote: neither ends a string
        text = text.translate(None, _NOT_ESCAPES)  # what may follow a backslash stays: escapes stay whole
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = text.translate(_SQUARE, _NOT_MARKS)  # only [ ] (objects as arrays) and quotes
    if b'"' in marks:
        marks = marks.replace(b'""', b"")  # strings without a bracket (two strings: merged, alike)
        if b'"' in marks:
            marks = b"".join(marks.split(b'"')[0::2])  # what lies between strings
    return _bracket_depth(marks)


def _bracket_depth(brackets: bytes) -> int:
    """The deepest running count of ``[`` minus ``]`` in a string of only those two."""
    trimmed = 0
    while brackets and trimmed <= MAX_DEPTH:  # each pass: every innermost pair, one level
        shorter = brackets.replace(b"[]", b"")
        taken = len(brackets) - len(shorter)
        if taken:
            brackets, trimmed = shorter, trimmed + 1
        if taken * SHRINK < len(brackets) + taken:
            break
    if not brackets:
        return trimmed
    lengths = list(map(len, _RUN.findall(brackets)))
    opens_first = brackets[:1] == b"["
    opens = accumulate(lengths[0::2] if opens_first else lengths[1::2])
    closes = accumulate(lengths[1::2] if opens_first else lengths[0::2])
    before_each_open = chain((0,), closes) if opens_first else closes
    return trimmed + max(0, max(map(sub, opens, before_each_open), default=0))


def check_depth(data: Data) -> None:
    """:class:`PeerJsonError` when ``data`` nests deeper than :data:`MAX_DEPTH`."""
    found = depth(data)
    if found > MAX_DEPTH:
        raise PeerJsonError(f"JSON nested {found} levels deep, over the {MAX_DEPTH} decoded")


def _reason(err: BaseException) -> str:
    said = " ".join(printable(str(err)).split()) or type(err).__name__
    return said if len(said) <= MAX_REASON else said[: MAX_REASON - 3] + "..."


class Decoder(Generic[T]):
    """A typed decoder (msgspec's, built once) behind :func:`check_depth`: strict JSON, the
    type's bounds checked while decoding."""

    def __init__(self, kind: type[T]) -> None:
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(kind)

    def decode(self, data: Data, checked: bool = False) -> T:
        """``data`` as the type; :class:`PeerJsonError` with the reason for anything else.
        ``checked``: ``data`` is a part (a ``msgspec.Raw``) of a text this module decoded,
        whose depth bounds the part's: not measured again."""
        if not checked:
            check_depth(data)
        try:
            return self._decoder.decode(data)
        # ValidationError included; bad UTF-8 in a string is UnicodeDecodeError, a ValueError
        except (msgspec.DecodeError, ValueError, RecursionError) as err:
            raise PeerJsonError(_reason(err)) from None


_ANY: Decoder[Any] = Decoder(Any)


def decode(data: Data) -> Any:
    """Strict JSON, untyped (:class:`Decoder` of ``Any``)."""
    return _ANY.decode(data)


def loads(data: Data) -> Any:
    """JSON in Python's own dialect (``NaN``, ``Infinity``: what ``json.dumps`` writes, so
    what a Python peer may send), through :func:`check_depth`; :class:`PeerJsonError`."""
    check_depth(data)
    try:
        return json.loads(data if isinstance(data, (str, bytes, bytearray)) else bytes(data))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise PeerJsonError(_reason(err)) from None


def nan_as_null(data: Data) -> bytes:
    """``data`` with each ``NaN``, ``Infinity`` and ``-Infinity`` Python's ``json.dumps``
    wrote as a value made ``null``, so that strict JSON decodes the rest (a string holding
    such a value, as ``"[NaN]"``, is changed too: still a string)."""
    return _NOT_JSON.sub(rb"\1null", _as_bytes(data))
