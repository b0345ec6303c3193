"""Property-based fuzzing (hypothesis) of what parses untrusted input: the GGUF reader, the
tokenizer, the chat-template renderer.

Properties: nothing but the documented errors escapes, nothing hangs (per-example deadline),
and whatever the reader accepts is internally consistent. EDGED_FUZZ_EXAMPLES sets the number
of inputs per test (default 200, for CI); SECURITY.md records longer runs.
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf_bytes as gb
from hardening_files import llama_file, one_tensor
from edged.errors import ModelFormatError, TemplateError
from edged.format.gguf import GGUFFile

EXAMPLES = int(os.environ.get("EDGED_FUZZ_EXAMPLES", "200"))
# EDGED_FUZZ_RANDOM=1: fresh random inputs each run (default: the same inputs every run).
FUZZ = settings(max_examples=EXAMPLES, deadline=2000,
                derandomize=not os.environ.get("EDGED_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SEEDS = [gb.valid_file(), gb.valid_file(version=2), llama_file(), one_tensor([64], gb.T_Q8_0, data=b"\0" * 68)]


def parse(data):
    """Open `data` the way the daemon opens a model (an fd, mapped read-only)."""
    fd = os.memfd_create("fuzz", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        return GGUFFile.from_fd(fd, name="fuzz.gguf")
    finally:
        os.close(fd)


def check_accepted(f):
    """Invariants of a file the reader accepted."""
    assert f.version in (2, 3)
    assert f.alignment > 0 and f.alignment & (f.alignment - 1) == 0
    assert f.data_offset % f.alignment == 0
    end = f.data_offset
    for t in f.tensors.values():
        assert 1 <= len(t.shape) <= 4 and all(d > 0 for d in t.shape)
        assert t.offset >= end and t.offset + t.nbytes <= f.file_size
        assert (t.offset - f.data_offset) % f.alignment == 0
        assert len(f.tensor_bytes(t.name)) == t.nbytes
        end = t.offset + t.nbytes


def mutate(data, edits):
    b = bytearray(data)
    for kind, pos, value in edits:
        if not b:
            break
        pos %= len(b)
        if kind == 0:                                  # overwrite one byte
            b[pos] = value & 0xFF
        elif kind == 1:                                # overwrite a u64 (length/count/offset)
            b[pos:pos + 8] = value.to_bytes(8, "little")
        elif kind == 2:                                # truncate
            del b[pos:]
        elif kind == 3:                                # insert bytes
            b[pos:pos] = value.to_bytes(8, "little")[: 1 + value % 8]
        else:                                          # delete bytes
            del b[pos:pos + 1 + value % 16]
    return bytes(b)


EDITS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 20),
                           st.one_of(st.integers(0, 255), st.integers(0, 2**64 - 1),
                                     st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))),
                 min_size=1, max_size=6)


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=EDITS)
def test_reader_mutated_files(seed, edits):
    data = mutate(seed, edits)
    try:
        f = parse(data)
    except ModelFormatError as e:
        assert "fuzz.gguf" in str(e)
        return
    with f:
        check_accepted(f)


@FUZZ
@given(data=st.binary(min_size=0, max_size=512))
def test_reader_random_bytes_after_the_magic(data):
    try:
        with parse(b"GGUF" + data) as f:
            check_accepted(f)
    except ModelFormatError:
        pass


@FUZZ
@given(n_kv=st.integers(0, 2**64 - 1), n_tensors=st.integers(0, 2**64 - 1),
       tail=st.binary(max_size=256))
def test_reader_header_counts(n_kv, n_tensors, tail):
    try:
        with parse(gb.build([], n_kv=n_kv, n_tensors=n_tensors) + tail) as f:
            check_accepted(f)
    except ModelFormatError:
        pass


# --- tokenizer and chat templates (text) --------------------------------------------------------

def _chat_or_skip():
    try:
        from edged.text import chat
    except ImportError:
        pytest.skip("edged.text.chat is not on this branch yet (text)")
    return chat


def _tokenizer_or_skip():
    try:
        from edged.text.tokenizer import Tokenizer
    except ImportError:
        pytest.skip("edged.text.tokenizer is not on this branch yet (text)")
    return Tokenizer


JINJA_PIECES = st.sampled_from([
    "{{ ", " }}", "{% ", " %}", "{# ", " #}", "messages", "message", "['content']", ".content",
    "for message in messages", "endfor", "if", "endif", "else", "loop.index", "|length", "|join",
    "raise_exception('x')", "bos_token", "__class__", "__globals__", "__subclasses__()", "range(",
    ")", "(", "[", "]", "'", '"', "~", "+", "*", "10**9", "namespace(", "set ", "=", "x", " ",
    "\n", "{%- ", " -%}", "add_generation_prompt", "tojson", "strip", "cycler", "joiner",
])


@FUZZ
@given(pieces=st.lists(JINJA_PIECES, max_size=24),
       content=st.text(max_size=64))
def test_chat_template_renderer(pieces, content):
    chat = _chat_or_skip()
    template = "".join(pieces)
    try:
        out = chat.render(template, [{"role": "user", "content": content}])
    except TemplateError:
        return
    assert isinstance(out, str)


# U+2581 is SPM's space marker: it decodes to " " (as in llama.cpp), so it is left out. Lone
# surrogates (which JSON can carry) cannot be UTF-8: they must encode without error, but need
# not round-trip.
@FUZZ
@given(text=st.text(st.characters(blacklist_characters="\u2581"), max_size=200), raw=st.binary(max_size=64))
def test_tokenizer_round_trip_and_decode(text, raw):
    Tokenizer = _tokenizer_or_skip()
    tok = _fuzz_tokenizer(Tokenizer)
    ids = tok.encode(text, add_special=False)
    assert all(0 <= i < tok.n_vocab for i in ids)
    if not any("\ud800" <= c <= "\udfff" for c in text):
        assert tok.decode(ids) == text
    # arbitrary ids: any valid id decodes, without exceptions
    tok.decode([b % tok.n_vocab for b in raw])


_TOKENIZER = {}


def _fuzz_tokenizer(Tokenizer):
    """A byte-fallback SPM vocabulary (every byte has a token), so any text round-trips."""
    if "t" not in _TOKENIZER:
        import tempfile

        from hardening_files import tokenizer_kvs
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a", "\u2581a"]
        types = [2, 3, 3] + [6] * 256 + [1, 1, 1]
        data = llama_file(n_vocab=len(tokens), tok_kvs=tokenizer_kvs(tokens=tokens, types=types))
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(data)
            f.flush()
            _TOKENIZER["t"] = Tokenizer.from_gguf(f.name)
    return _TOKENIZER["t"]
