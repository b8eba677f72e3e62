"""Request checks that need no model: a client's mistake is a 400, never a 500."""

from __future__ import annotations

import pytest

from contract.openai_errors import ApiError
from serving.api.validation import _check_logit_bias, logit_bias_pairs


@pytest.mark.parametrize("key", ["\u00b2", "\u0663", "9" * 5000, "-1", " 1", ""])
def test_logit_bias_key_that_is_no_ascii_token_id_is_invalid(key: str) -> None:
    """Keys int() cannot take ("²", 5000 digits) are refused as invalid, not raised."""
    with pytest.raises(ApiError) as caught:
        _check_logit_bias({key: 1.0})
    assert caught.value.status == 400 and caught.value.body.param == "logit_bias"
    _check_logit_bias({"42": 1.0})
    assert logit_bias_pairs({"42": 1.0}, 100) == [(42, 1.0)]
