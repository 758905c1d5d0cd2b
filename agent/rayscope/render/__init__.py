"""Pure formatting: ClusterStatus / NodeDiagnostics / FitResult → text. Never queries.

One module per output, so a change to one output touches one file:

* :mod:`rayscope.render.status` — ``status`` lines, JSON, ``--append`` NDJSON, completeness note
* :mod:`rayscope.render.metrics` — Prometheus text (``/metrics``, ``--format prom``)
* :mod:`rayscope.render.node` — ``rayscope node``
* :mod:`rayscope.render.gpus` — per-GPU bookings beside measured memory (``--gpus``)
* :mod:`rayscope.render.fit` — ``rayscope fit``
* :mod:`rayscope.render.watch` — ``status --watch`` header and highlighting
* :mod:`rayscope.render.fmt` — what they share: sizes, numbers, JSON, which nodes to show
"""
