"""Self-signed certificates made for one use, and client contexts that trust only them.

Sync serves model files with one (orchestrator/provision/sync/head_serve.py); each launch
gives rank 0 one for its API when it is reached over the network (launch/rank0_tls.py).
The certificate travels over the SSH channel the orchestrator already trusts, so pinning
it needs no CA and no hostname: only the holder of its key can complete the handshake.
"""

from __future__ import annotations

import datetime
import functools
import ssl


def self_signed(common_name: str, days: int = 7) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM): a self-signed P-256 certificate."""
    # cryptography here: 0.1 s that a launch on loopback, which needs no certificate, skips
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@functools.lru_cache(maxsize=8)  # one per launch's certificate: made once, not per request
def pinned_for(cert_pem: str) -> ssl.SSLContext | bool:
    """aiohttp's `ssl` argument for a URL whose certificate is cert_pem: the pinned context,
    or True (the default, unused by plain http://) when there is none."""
    return pinned(cert_pem) if cert_pem else True


def pinned(cert_pem: str) -> ssl.SSLContext:
    """A TLS 1.3 client context that trusts cert_pem and nothing else."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # an address, not a name: the pinned certificate is the check
    context.load_verify_locations(cadata=cert_pem)
    return context
