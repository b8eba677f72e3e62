"""The gateway's HTTP protocol: uvicorn's C parser with a deadline and a byte cap on each
request head (contract/http_limits.py says why)."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contract.http_limits import HeadDeadline


class HttpProtocol(HeadDeadline, HttpToolsProtocol):
    """What the gateway's uvicorn serves each connection with."""
