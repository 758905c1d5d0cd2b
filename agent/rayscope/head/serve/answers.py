"""The head's rendered answers, each representation rendered once per change, not per request.

At 10,000 nodes one merge and JSON render of ``/v1/status`` costs ~0.1 s and the
Prometheus text ~0.4 s of the head's CPU; a dashboard, a cron job and a few operators asking
every few seconds would keep it busy for nothing. So each representation (the JSON document,
the status lines, the metrics; each with its options) is kept as bytes with the
:attr:`HeadState.version <rayscope.head.store.state.HeadState.version>` it was rendered at, and is
served again:

* while it is younger than :func:`refresh_s` (at most :data:`REFRESH_S`), whatever changed:
  under a steady stream of reports the state changes thousands of times a second;
* up to :func:`max_age_s` (at most :data:`MAX_AGE_S`) when nothing changed: ages and
  staleness move with the clock alone, so a render does not stay for ever.

Both are fractions of the head's interval, so an answer is never more than a quarter of an
interval behind the reports, or half of one behind the clock. One request renders while the
others asking for the same representation wait for it (no stampede). A gzip copy is made
once, for the first client that accepts it (:func:`accepts_gzip`: the ``Accept-Encoding``
weights read, ``gzip;q=0`` is a refusal), and every answer says ``Vary: Accept-Encoding``.

The usage history (``/v1/usage``, and the per-app figures of ``/metrics`` and the page) costs
more (0.6-0.9 s at 1,000 actors over a full window) and changes only when the poller folds an
interval's reports into it (:attr:`UsageStore.version <rayscope.head.store.usage_store.UsageStore.version>`):
its document is computed once per fold, and at least once per interval (ages move), per
window and headroom asked; its JSON once per document.
"""

import gzip
import json
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Callable, NamedTuple, Optional, Union

from rayscope.core.completeness import assess
from rayscope.core.isolation import recording
from rayscope.core.usage.summary import DEFAULT_HEADROOM_PCT
from rayscope.defaults import HEADER_EXIT, HEADER_NOTE, HEADER_NOTES, HEADER_SCHEMA
from rayscope.head.store.state import HeadState
from rayscope.render.status import source_details
from rayscope.render.usage import usage_json
from rayscope.schema.status import DOCUMENT_SCHEMA, ClusterStatus
from rayscope.schema.usage import UsageDocument
from rayscope.units import is_count

REFRESH_S = 0.5
MAX_AGE_S = 2.0
GZIP_LEVEL = 1
"""Fast: the JSON of 10,000 nodes shrinks ~12× at level 1 in ~20 ms (level 6: ~15×, ~60 ms)."""
VARY = ("Vary", "Accept-Encoding")
"""On every answer that can be gzipped, either way: a cache between the head and its
clients must not hand a gzip body to a client that did not ask for one, nor the reverse."""
_GZIP_NAMES = ("gzip", "x-gzip")


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value (RFC 9110, 12.5.3) takes gzip: ``gzip`` (or
    ``x-gzip``) with a weight above 0, or ``*`` above 0 where gzip is not named. A weight
    is read as ASCII (:func:`_weight`); a member whose weight does not parse counts as not
    offered. Before: any value containing ``gzip`` got gzip, ``gzip;q=0`` (refused) too."""
    named: Optional[bool] = None
    star = False
    for member in header.split(","):
        coding, _, params = member.partition(";")
        coding = coding.strip(" \t").lower()
        weight = _weight(params)
        if coding in _GZIP_NAMES:
            named = bool(named) or weight > 0
        elif coding == "*":
            star = weight > 0
    return named if named is not None else star


def _weight(params: str) -> int:
    """A member's ``q`` in thousandths (1000 without one); 0 when it does not parse.
    ``qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )``, ASCII digits only."""
    weight = 1000
    for param in params.split(";"):
        name, equals, value = param.strip(" \t").partition("=")
        if not equals or name.strip(" \t").lower() != "q":
            continue
        whole, _, fraction = value.strip(" \t").partition(".")
        if whole not in ("0", "1") or len(fraction) > 3 or (fraction and not is_count(fraction)):
            return 0
        weight = int(whole) * 1000 + (int(fraction.ljust(3, "0")) if fraction else 0)
        if weight > 1000:
            return 0
    return weight


MAX_ENTRIES = 64
"""Answers kept at once: a usage query names its own window and headroom, so its keys are the
client's; past this many, the least recently asked is dropped (and rendered again if asked)."""


def refresh_s(interval_s: float) -> float:
    return min(REFRESH_S, interval_s / 4)


def max_age_s(interval_s: float) -> float:
    return min(MAX_AGE_S, interval_s / 2)


def _monotonic() -> float:
    return time.monotonic()  # looked up per call: tests move the clock


class Rendered(NamedTuple):
    """One representation as served: its body and the headers that describe the status."""

    body: Union[bytes, bytearray]
    """A ``bytearray`` only for a body encoded into a :data:`Spare`: never changed while
    anything but its entry holds it."""
    headers: tuple[tuple[str, str], ...]


Spare = Optional[bytearray]
"""The buffer of the previous render of the same answer, when nothing holds it any more (no
client is still being sent it): the next render may encode into it. At 10,000 nodes a fresh
52 MB buffer per render cost 13,000 page faults, a third of the encode."""
Render = Callable[[ClusterStatus, Spare], Rendered]


def status_headers(status: ClusterStatus) -> tuple[tuple[str, str], ...]:
    """What a client needs besides the body to behave as ``status`` does: the exit code and
    the completeness note (stderr), the ``--verbose`` source lines, the document schema.
    Values JSON-encoded as ASCII, so no byte of a peer's text can break a header."""
    code, note = assess(status)
    return (
        (HEADER_EXIT, str(code)),
        (HEADER_NOTE, json.dumps(note or "")),
        (HEADER_NOTES, json.dumps(source_details(status.sources))),
        (HEADER_SCHEMA, str(DOCUMENT_SCHEMA)),
    )


def _spare(entry: "_Entry") -> Spare:
    """``entry``'s body, let go, when it is a buffer nothing else holds: no response still
    being sent holds it (a response, and each piece of it the transport holds, keeps a
    reference), so the next render may write into it. Exact under the GIL: ``sys.getrefcount``
    counts every holder."""
    old, entry.value = entry.value, None
    body = old.body if isinstance(old, Rendered) else None
    del old
    # Holders now: ``body`` here and getrefcount's own argument; a third is a client's.
    return body if isinstance(body, bytearray) and sys.getrefcount(body) == 2 else None


class _Entry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = -1
        self.rendered_at = float("-inf")
        self.value: Any = None
        self.gzipped: Optional[bytes] = None


Fresh = Callable[[float, bool], bool]
"""Whether a kept answer may be served: (its age in seconds, whether nothing changed since)."""


class Answers:
    """The cached answers of one head; every method is safe across the HTTP port's threads."""

    def __init__(self, state: HeadState) -> None:
        self.state = state
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.renders = 0
        """How many status renders were made (``/healthz`` does not show it; tests do)."""
        self.usage_renders = 0
        """How many usage documents were computed (tests)."""

    def get(self, key: Hashable, render: Render, gpus: bool, gzipped: bool = False) -> Rendered:
        """The representation ``key`` (rendered by ``render`` from the status with or without
        the per-GPU attribution), as bytes; gzip-compressed when ``gzipped``."""
        interval = self.state.interval_s

        def fresh(age: float, unchanged: bool) -> bool:
            return age < refresh_s(interval) or (unchanged and age < max_age_s(interval))

        def make(now: float, spare: Spare) -> Rendered:
            self.renders += 1
            status = self.state.status(now, gpus=gpus, wall_now=time.time())
            with recording(self.state.failures):  # a node a renderer fails on: counted
                return render(status, spare)

        return self._served(key, self.state.version, fresh, make, gzipped)

    def usage_document(
        self, window_s: Optional[float] = None, headroom_pct: float = DEFAULT_HEADROOM_PCT
    ) -> UsageDocument:
        """The usage document for ``window_s`` (``None``: the whole window) and the headroom,
        computed once per fold of the usage store (at least once per interval)."""
        entry = self._entry(("usage-document", window_s, headroom_pct))

        def make(now: float, spare: Spare) -> UsageDocument:
            self.usage_renders += 1
            return self.state.usage.document(now, window_s, headroom_pct)

        with entry.lock:
            document: UsageDocument = self._current(entry, self.state.usage.version, self._usage_fresh, make)
            return document

    def usage(self, window_s: Optional[float], headroom_pct: float) -> Rendered:
        """``/v1/usage``'s body for these options, encoded once per document."""

        def make(now: float, spare: Spare) -> Rendered:
            return Rendered(usage_json(self.usage_document(window_s, headroom_pct)).encode(), ())

        key = ("usage", window_s, headroom_pct)
        return self._served(key, self.state.usage.version, self._usage_fresh, make, False)

    def _usage_fresh(self, age: float, unchanged: bool) -> bool:
        return unchanged and age < self.state.interval_s

    def _entry(self, key: Hashable) -> _Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
                if len(self._entries) > MAX_ENTRIES:
                    self._entries.popitem(last=False)  # a request holding it still finishes
            else:
                self._entries.move_to_end(key)
            return entry

    @staticmethod
    def _current(entry: _Entry, version: int, fresh: Fresh, make: Callable[[float, Spare], Any]) -> Any:
        """``entry``'s value, made again unless ``fresh``; under ``entry.lock`` (one request
        makes it while the others asking for it wait)."""
        now = _monotonic()
        if entry.value is None or not fresh(now - entry.rendered_at, entry.version == version):
            entry.value, entry.gzipped = make(now, _spare(entry)), None
            entry.version, entry.rendered_at = version, now
        return entry.value

    def _served(
        self,
        key: Hashable,
        version: int,
        fresh: Fresh,
        make: Callable[[float, Spare], Rendered],
        gzipped: bool,
    ) -> Rendered:
        entry = self._entry(key)
        with entry.lock:
            value: Rendered = self._current(entry, version, fresh, make)
            if not gzipped:
                return Rendered(value.body, (*value.headers, VARY))
            if entry.gzipped is None:
                entry.gzipped = gzip.compress(value.body, GZIP_LEVEL, mtime=0)
            return Rendered(entry.gzipped, (*value.headers, ("Content-Encoding", "gzip"), VARY))
