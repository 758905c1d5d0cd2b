"""One module per outside library: the only place psutil, pynvml and ray are imported.

Every source returns its data plus a :class:`~agent.schema.report.SourceStatus` and never raises.
"""
