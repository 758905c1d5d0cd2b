"""A throwaway PKI for the TLS tests: a CA, a head certificate for 127.0.0.1 and a client certificate."""

import subprocess
from pathlib import Path


def make_pki(root: Path) -> dict[str, Path]:
    """A throwaway CA, a head certificate for 127.0.0.1 and a client certificate (openssl CLI)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca")
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("head", "client"):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=rayscope-{name}")
        sign = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"]
        openssl(*sign, "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return {n: root / n for n in ("ca.pem", "head.pem", "head.key", "client.pem", "client.key")}


def tls_options(pki: dict[str, Path], side: str) -> list[str]:
    """``--tls-cert``, ``--tls-key`` and ``--tls-ca`` for ``side`` (``head`` or ``client``) from
    :func:`make_pki`'s files."""
    return [
        "--tls-cert",
        str(pki[f"{side}.pem"]),
        "--tls-key",
        str(pki[f"{side}.key"]),
        "--tls-ca",
        str(pki["ca.pem"]),
    ]
