"""Every msgspec Struct rayscope reads, merges, sends or prints, one module per document:

* :mod:`rayscope.schema.report` — the node report, the only schema that crosses releases
  (its rules there);
* :mod:`rayscope.schema.status` — the cluster status document and what it is merged from;
* :mod:`rayscope.schema.pending` — what waits to be placed;
* :mod:`rayscope.schema.fit` — ``rayscope fit``;
* :mod:`rayscope.schema.node` — ``rayscope node``.

Structs and nothing else: no formatting, no I/O; and here the documents' version, which
``status --head``'s fast path (:mod:`rayscope.cli.fast_status`) checks without building a Struct.
"""

DOCUMENT_SCHEMA = 2
"""Version of the documents rayscope prints and serves (status, node, fit). 2: BioEngine's
GPU memory keys and ``accelerator_type`` in BioEngine's types, rayscope's own ``_bytes``
keys beside them, ``pending_resources`` absent when not read (docs/json.md lists each change)."""
