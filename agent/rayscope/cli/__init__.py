"""The command line: typer commands (`app`), the options they share, the argv fix-ups before
click reads it, `status`'s fast path, its output routing and `--watch`'s terminal."""
