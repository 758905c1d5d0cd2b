"""The head agent: takes node reports, reads the scheduler once per interval, serves the rollup.

Its folders, around one :class:`~rayscope.head.store.state.HeadState`:

* :mod:`rayscope.head.serve` — transport: the report port (``ingest``: frames of
  :mod:`rayscope.net.wire`, one reused typed decoder), the HTTP port (``http``: read in the event
  loop, answered by a bounded pool), what each path answers (``routes``) and each answer
  rendered once per change (``answers``);
* :mod:`rayscope.head.access` — who may ask: the ``Host`` names the head answers (``origin``),
  the page's login (``session``), wrong tokens per client (``guesses``), what strangers may
  hold (``admission``);
* :mod:`rayscope.head.store` — state: the latest report per node and scheduler view
  (``state``), which connection owns which node (``reports``), the usage history
  (``usage_store``), node failures (``failures``);
* :mod:`rayscope.head.poll` — what the head reads itself once per interval: the GCS
  (``poller``) and Ray's dashboard (``dashboard``);
* :mod:`rayscope.head.daemon` — the servers together, and the ``rayscope head`` command's wiring.

A bad frame is logged and its connection dropped; the head keeps serving everyone else.
"""
