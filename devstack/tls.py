"""A throwaway certificate for ``make cluster --tls`` and the HTTPS tests.

One PEM file holding a self-signed certificate for ``localhost`` and ``127.0.0.1`` and its key,
as HAProxy's ``bind ... ssl crt FILE`` reads it. Made with ``cryptography``, which the edge
already installs (``joserfc`` needs it), so no ``openssl`` command is required. Browsers and
clients must be told to accept it (``curl -k``, Playwright's ``ignore_https_errors``); a real
deployment uses its own certificate (``--tls-cert``, docs/tls.md).

``python -m devstack.tls FILE`` writes one, e.g. for ``deploy/haproxy/certs/edge.pem`` (left
readable by others: the HAProxy image reads it as its own user; it guards nothing).
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LIFETIME = datetime.timedelta(days=30)


def make_certificate(path: Path) -> Path:
    """Write a self-signed certificate and its key (one PEM) to ``path``; return it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a clock a little behind
        .not_valid_after(now + LIFETIME)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        certificate.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m devstack.tls FILE.pem")
    print(make_certificate(Path(sys.argv[1])))
