"""Pure formatting: ClusterStatus / NodeDiagnostics / FitResult → text. Never queries.

One module per output, so a change to one output touches one file:

* :mod:`agent.render.status` — ``status`` lines, JSON, ``--append`` NDJSON, completeness note
* :mod:`agent.render.metrics` — Prometheus text (``/metrics``, ``--format prom``)
* :mod:`agent.render.node` — ``rayscope node``
* :mod:`agent.render.gpus` — per-GPU bookings beside measured memory (``--gpus``)
* :mod:`agent.render.fit` — ``rayscope fit``
* :mod:`agent.render.watch` — ``status --watch`` header and highlighting
* :mod:`agent.render.fmt` — what they share: sizes, numbers, JSON, which nodes to show
"""
