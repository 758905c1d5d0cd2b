"""The pure parts: no I/O and no clock (the time is a parameter). They import only
`rayscope.schema`, `rayscope.units`, `rayscope.labels`, `rayscope.errors`, `rayscope.defaults`
and each other
(tests/test_layering.py)."""
