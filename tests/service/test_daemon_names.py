"""Model names are matched whole: a trailing newline is not part of a valid name (issue 13.8)."""
import pytest

from edged.errors import RequestError
from edged.service.names import check_model_name, list_models


@pytest.mark.parametrize("name", ["s\n", "alpha\n", "a\nb", "x" * 129])
def test_name_with_newline_or_too_long_is_refused(name):
    with pytest.raises(RequestError, match="invalid model name"):
        check_model_name(name)


def test_listing_skips_names_that_would_be_refused(tmp_path):
    for name in ("good", "s\n", ".hidden"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    assert list_models(str(tmp_path)) == ["good"]
    assert check_model_name("good") == "good"
