"""One module per outside library: the only place psutil, pynvml and ray are imported.

Every source returns its data plus a :class:`~rayscope.schema.report.SourceStatus` and never raises.
"""
