"""httpx's default certificate check, built once per test process.

`httpx.get(...)` (any top-level call) builds a new client, and with it a new SSL context
that loads the CA bundle: 30-50 ms of CPU per request, plain http:// included. A poll
loop of them took a share of a core from the ranks it waited for. Passing this context as
`verify=` checks certificates exactly as `verify=True` does (httpx builds that one with the
same call), for the cost of the request alone.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def default_tls() -> ssl.SSLContext:
    """The context httpx builds for verify=True (CA bundle, SSL_CERT_FILE / SSL_CERT_DIR)."""
    return httpx.create_ssl_context()
