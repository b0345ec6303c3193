"""The <think> split (text/reasoning.py), whole and streamed."""
import pytest

from edged.text import reasoning

CASES = [
    ("<think>\nThe user greets.\n</think>\n\nHello!", False, "The user greets.", "Hello!"),
    ("The user greets.\n</think>\n\nHello!", True, "The user greets.", "Hello!"),   # prompt opened it
    ("Hello!", False, None, "Hello!"),
    ("<think>\n\n</think>\n\nHi", False, None, "Hi"),                             # thinking turned off
    ("<think>still thinking", False, "still thinking", ""),                      # cut by max_tokens
    ("Use <think> tags", False, None, "Use <think> tags"),
]


@pytest.mark.parametrize("text, inside, want_r, want_c", CASES)
def test_split(text, inside, want_r, want_c):
    assert reasoning.split(text, inside) == (want_r, want_c)


@pytest.mark.parametrize("text, inside, want_r, want_c", CASES)
def test_streamed_in_pieces_is_the_same(text, inside, want_r, want_c):
    for size in (1, 2, 3, 7):
        s = reasoning.ThinkSplitter(inside)
        r = c = ""
        for i in range(0, len(text), size):
            dr, dc = s.push(text[i:i + size])
            assert "</think" not in dr and "<think>" not in dc or want_c.count("<think>")
            r, c = r + dr, c + dc
        dr, dc = s.flush()
        r, c = r + dr, c + dc
        assert (r.strip() or None, c) == (want_r, want_c)


def test_starts_inside():
    assert reasoning.starts_inside("<|im_start|>assistant\n<think>\n")
    assert not reasoning.starts_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not reasoning.starts_inside("<|im_start|>assistant\n")
