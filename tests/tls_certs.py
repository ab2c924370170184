"""A throw-away CA and certificates for TLS tests (generated with ``trustme``)."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

import pytest


@dataclass
class TlsFiles:
    """SSL contexts and PEM files for one test CA."""

    ca: object
    server_ctx: ssl.SSLContext  # certificate for 127.0.0.1 / localhost / ::1
    client_ctx: ssl.SSLContext  # trusts the CA
    ca_pem: str
    server_pem: str  # key + certificate chain
    client_pem: str  # key + certificate chain (for mutual TLS)
    client_cert_ctx: ssl.SSLContext  # trusts the CA and presents the client certificate
    mtls_server_ctx: ssl.SSLContext  # requires a client certificate signed by the CA


@functools.cache
def tls_files() -> TlsFiles:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost", "::1")
    client = ca.issue_cert("client@example.org")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    client_cert_ctx = ssl.create_default_context()
    ca.configure_trust(client_cert_ctx)
    client.configure_cert(client_cert_ctx)
    mtls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(mtls)
    ca.configure_trust(mtls)
    mtls.verify_mode = ssl.CERT_REQUIRED
    return TlsFiles(
        ca=ca,
        server_ctx=server_ctx,
        client_ctx=client_ctx,
        ca_pem=ca.cert_pem.bytes().decode(),
        server_pem=b"".join(b.bytes() for b in [server.private_key_pem, *server.cert_chain_pems]).decode(),
        client_pem=b"".join(b.bytes() for b in [client.private_key_pem, *client.cert_chain_pems]).decode(),
        client_cert_ctx=client_cert_ctx,
        mtls_server_ctx=mtls,
    )
