"""TLS for the report port and the HTTP port, from the standard library's ``ssl`` module.

The head presents ``--tls-cert``/``--tls-key``; with ``--tls-ca`` it also requires each client
(agent or ``status --head``) to present a certificate that CA signed. A client verifies the
head against ``--tls-ca`` (else the system's CAs) and presents ``--tls-cert``/``--tls-key``
when given. TLS 1.2 at least.
"""

import os
from typing import TYPE_CHECKING, NamedTuple, Optional

from rayscope.defaults import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

if TYPE_CHECKING:  # ssl is imported only when TLS is used (status --head is the fast path)
    import ssl

ENV = {"cert": TLS_CERT_ENV, "key": TLS_KEY_ENV, "ca": TLS_CA_ENV}


class TlsFiles(NamedTuple):
    cert: Optional[str] = None
    key: Optional[str] = None
    ca: Optional[str] = None

    @property
    def enabled(self) -> bool:
        return any(self)

    @classmethod
    def from_env(cls) -> "TlsFiles":
        """``$RAYSCOPE_TLS_CERT``, ``_KEY``, ``_CA`` (what the ``--tls-*`` options default to)."""
        return cls(*(os.environ.get(ENV[f]) or None for f in cls._fields))


def _load(context: "ssl.SSLContext", files: TlsFiles) -> None:
    import ssl

    try:
        if files.cert:
            context.load_cert_chain(files.cert, files.key)
        if files.ca:
            context.load_verify_locations(files.ca)
    except (OSError, ssl.SSLError) as err:
        what = getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
        raise ValueError(f"cannot load TLS files ({files.cert or files.ca}): {what}") from None


def server_context(files: TlsFiles) -> Optional["ssl.SSLContext"]:
    """The head's context, ``None`` without TLS; ``ValueError`` (one line) on bad files."""
    import ssl

    if not files.enabled:
        return None
    if not (files.cert and files.key):
        raise ValueError("the head needs both --tls-cert and --tls-key for TLS")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, files)
    if files.ca:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(files: TlsFiles) -> Optional["ssl.SSLContext"]:
    """An agent's or ``status --head``'s context, ``None`` without TLS."""
    import ssl

    if not files.enabled:
        return None
    if bool(files.cert) != bool(files.key):
        raise ValueError("a client certificate needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, files)
    return context


NO_TLS = TlsFiles()
