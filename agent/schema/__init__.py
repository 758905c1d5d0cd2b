"""Every msgspec Struct rayscope reads, merges, sends or prints, one module per document:

* :mod:`agent.schema.report` — the node report, the only schema that crosses releases
  (its rules there);
* :mod:`agent.schema.status` — the cluster status document and what it is merged from;
* :mod:`agent.schema.pending` — what waits to be placed;
* :mod:`agent.schema.fit` — ``rayscope fit``;
* :mod:`agent.schema.node` — ``rayscope node``.

Structs and nothing else: no formatting, no I/O.
"""
