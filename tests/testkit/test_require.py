"""testkit/require.py: a missing tool skips here and fails where CI requires it."""

from __future__ import annotations

import pytest

from testkit import require


def test_missing_openblas_is_quiet_here_and_a_failure_where_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No OpenBLAS: None (the 4-bit model, no BLAS check), unless OPENBLAS=1: then the test
    fails naming the package to install; where it is installed, its path either way."""
    monkeypatch.setattr(require, "find_openblas", lambda: None)
    monkeypatch.delenv(require.OPENBLAS, raising=False)
    assert require.openblas() is None
    monkeypatch.setenv(require.OPENBLAS, "1")
    with pytest.raises(pytest.fail.Exception, match="libopenblas0-pthread"):
        require.openblas()
    monkeypatch.setattr(require, "find_openblas", lambda: "/usr/lib/libopenblas.so.0")
    assert require.openblas() == "/usr/lib/libopenblas.so.0"


def test_a_required_tool_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(require.ROOT, "1")
    with pytest.raises(pytest.fail.Exception, match="needs root"):
        require.missing("needs root", require.ROOT)
    monkeypatch.delenv(require.ROOT)
    with pytest.raises(pytest.skip.Exception):
        require.missing("needs root", require.ROOT)
