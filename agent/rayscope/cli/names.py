"""The options ``status`` and the global flags take, declared once: each one's names, the
parameter it fills and the variable it reads. The typer app (:mod:`rayscope.cli.options`,
:mod:`rayscope.cli.app`) builds its options from these, and the fast path
(:mod:`rayscope.cli.fast_status`) parses with them; free of imports beyond the defaults.
"""

from typing import NamedTuple, Optional

from rayscope.defaults import HEAD_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_FILE_ENV


class Name(NamedTuple):
    """One option: what the command line says, and where its value goes."""

    flags: tuple[str, ...]
    key: str
    """The parameter it fills: the typer function's argument, the fast path's key."""
    env: Optional[str] = None
    """The variable read when it is not given (an empty one counts as unset, as click has it)."""
    takes_value: bool = True


VERBOSE = Name(("--verbose", "-v"), "verbose", takes_value=False)
HEAD = Name(("--head",), "head", HEAD_ENV)
GCS = Name(("--gcs",), "gcs")
TOKEN_FILE = Name(("--token-file",), "token_file", TOKEN_FILE_ENV)
TIMEOUT = Name(("--timeout",), "timeout")
FORMAT = Name(("--format",), "format_")
TLS_CERT = Name(("--tls-cert",), "tls_cert", TLS_CERT_ENV)
TLS_KEY = Name(("--tls-key",), "tls_key", TLS_KEY_ENV)
TLS_CA = Name(("--tls-ca",), "tls_ca", TLS_CA_ENV)
DASHBOARD = Name(("--dashboard",), "dashboard")
"""Its variable is read by the dashboard source, not by the option (``none`` and a URL alike)."""
ALL_NODES = Name(("--all",), "all_nodes", takes_value=False)
GPUS = Name(("--gpus",), "gpus", takes_value=False)
JSON = Name(("--json",), "json_out", takes_value=False)

STATUS = (HEAD, GCS, TOKEN_FILE, TIMEOUT, FORMAT, TLS_CERT, TLS_KEY, TLS_CA, DASHBOARD, ALL_NODES, GPUS, JSON)
"""The options of ``status`` the fast path reads; any other word hands the line to the CLI."""
