"""testkit's shared certificate check: built once, and as strict as httpx's verify=True."""

from __future__ import annotations

import ssl

import httpx

from testkit.http_tls import default_tls


def test_one_context_per_process() -> None:
    """Every caller gets the same context (building one loads the CA bundle)."""
    assert default_tls() is default_tls()


def test_it_checks_certificates_as_httpx_does() -> None:
    """Certificates required, host names checked, and the same CA certificates loaded."""
    ours, httpx_default = default_tls(), httpx.create_ssl_context()
    assert ours.verify_mode == ssl.CERT_REQUIRED
    assert ours.check_hostname
    assert ours.cert_store_stats() == httpx_default.cert_store_stats()
    assert ours.cert_store_stats()["x509_ca"] > 0
