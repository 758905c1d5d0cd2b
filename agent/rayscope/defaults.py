"""Every default and name more than one part of rayscope agrees on, defined once and free of
imports (the CLI's fast path and the GCS child's early start read it before anything else).

Ports, environment variables, deadlines, and the names of the HTTP headers the head and its
clients share. A part that needs one imports it from here; none keeps a copy."""

DEFAULT_GCS_PORT = 6379
"""Ray's GCS port when ``ray start --head`` is given none; ``--gcs HOST`` means this port."""
DEFAULT_REPORT_PORT = 7531
"""The head agent's report port (``head --listen``, ``push --head HOST``)."""
DEFAULT_HTTP_PORT = 7532
"""The head agent's HTTP port (``head --http``, ``status --head HOST``)."""

DEFAULT_TIMEOUT_S = 5.0
"""Deadline of one read of the GCS or the head agent (``--timeout``)."""
MAX_TIMEOUT_S = 86_400.0
"""The largest ``--timeout`` (and any other duration option): a day."""

GCS_ADDRESS_ENV = "RAYSCOPE_GCS"
RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""Ray's own variable (``ray.init()`` reads it): ``HOST:PORT`` of the GCS, ``auto``, or a
``ray://`` address of Ray Client; read after ``$RAYSCOPE_GCS``."""
RAY_CLIENT_PORT = 10001
"""Ray Client's server port when ``ray start --head`` is given none (``ray://HOST`` means it)."""
HEAD_ENV = "RAYSCOPE_HEAD"
TOKEN_FILE_ENV = "RAYSCOPE_TOKEN_FILE"
READ_TOKEN_FILE_ENV = "RAYSCOPE_READ_TOKEN_FILE"
TLS_CERT_ENV = "RAYSCOPE_TLS_CERT"
TLS_KEY_ENV = "RAYSCOPE_TLS_KEY"
TLS_CA_ENV = "RAYSCOPE_TLS_CA"
DASHBOARD_ENV = "RAYSCOPE_DASHBOARD"
"""Ray's dashboard to read (``--dashboard``): ``HOST[:PORT]``, ``http[s]://HOST[:PORT][/prefix]``
or ``none``; unset: the address the cluster published in its GCS."""

HEADER_EXIT = "X-Rayscope-Exit"
"""The exit code ``status`` would give for the answer (the head decides it once)."""
HEADER_NOTE = "X-Rayscope-Note"
"""The one line that says why, JSON-quoted."""
HEADER_NOTES = "X-Rayscope-Notes"
"""The sources' details (``--verbose``), a JSON list."""
HEADER_SCHEMA = "X-Rayscope-Schema"
"""The status document's schema number."""
HEADER_INDENT = "X-Rayscope-Indent"
"""On ``/v1/status?indent=1``: the body is the document indented by this many spaces, the
bytes ``status --json`` prints (a head that does not send it served the compact one)."""
HEADER_SESSION = "X-Rayscope-Session"
"""The page's session value, sent by its own script (never a cookie)."""
SERVER_NAME = "rayscope-head"
"""The head's ``Server`` header: how a client tells a head from another HTTP server."""
CLUSTER_RAY = "cluster Ray "
"""How the ``ray`` source's detail names the cluster's Ray release (``cluster Ray 2.60.0,
reader Ray 2.60.0``), written by the GCS read and read back by ``fit``."""
