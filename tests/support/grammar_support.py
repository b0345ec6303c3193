"""Driving a grammar.Constraint with a text, as the sampler would, on a real 49k vocabulary
(`smol_tokenizer`, a fixture), and the two tools the tool-call tests offer:
tests/text/test_tools*.py, test_gemma4_chat.py."""
import numpy as np
import pytest

from conftest import testdata

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]


@pytest.fixture(scope="module")
def smol_tokenizer():
    pytest.importorskip("llguidance")
    from edged.text.tokenizer import Tokenizer
    return Tokenizer.from_gguf(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def feed(constraint, tok, text):
    """Feed text's tokens through the constraint: True if every token was allowed and the
    grammar may end there."""
    for t in tok.encode(text, add_special=False, parse_special=False):
        bits = np.unpackbits(constraint.mask().view(np.uint8), bitorder="little")
        if not bits[t]:
            return False
        constraint.consume(t)
    return constraint.is_accepting()
