"""How peers talk and prove who they are: the report wire, TLS contexts, token files and
`HOST:PORT` addresses."""
