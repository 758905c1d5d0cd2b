"""The head agent: takes node reports, reads the scheduler once per interval, serves the rollup.

Its parts, one module each, around one :class:`~rayscope.head.state.HeadState` (the latest
report per node, stamped with the head's own receive time, and the latest scheduler view):

* :mod:`rayscope.head.ingest` — the report port: an asyncio protocol per node agent's
  connection, frames from :mod:`rayscope.net.wire` decoded by one reused typed decoder, with
  :mod:`rayscope.head.admission` bounding what strangers hold and :class:`rayscope.logs.LogThrottle`
  keeping a flood out of the log;
* :mod:`rayscope.head.poller` — one GCS read per interval in a thread (never one per report),
  restarted if it dies;
* :mod:`rayscope.head.http` — ``GET /v1/status`` (the JSON of ``status --json``), ``GET
  /metrics`` (Prometheus text), ``GET /healthz`` (counters), from the standard library's HTTP
  server with a bounded number of workers; :mod:`rayscope.head.routes` says what each path
  answers and to whom: only a request whose ``Host`` names the head (:mod:`rayscope.head.origin`),
  a token checked unless its client has been wrong too often (:mod:`rayscope.head.guesses`), the
  page's login kept by its script in the tab (:mod:`rayscope.head.session`);
* :mod:`rayscope.head.daemon` — the servers together, and the ``rayscope head`` command's
  wiring (options, agents placed through Ray, ``--remove``).

A bad frame is logged and its connection dropped; the head keeps serving everyone else.
"""
