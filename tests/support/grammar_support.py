"""Driving a grammar.Constraint with a text, as the sampler would: tests/text/test_tools*.py."""
import numpy as np


def feed(constraint, tok, text):
    """Feed text's tokens through the constraint: True if every token was allowed and the
    grammar may end there."""
    for t in tok.encode(text, add_special=False, parse_special=False):
        bits = np.unpackbits(constraint.mask().view(np.uint8), bitorder="little")
        if not bits[t]:
            return False
        constraint.consume(t)
    return constraint.is_accepting()
