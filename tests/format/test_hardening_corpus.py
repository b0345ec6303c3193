"""Regression corpus of malicious GGUF files, one per known vulnerability class of GGUF loaders
(llama.cpp's CVEs and GHSA advisories: count, length, dimension and size overflows, offsets
past the end or wrapping around, overlapping data, bad alignment, out-of-range layer counts,
malformed tokenizer arrays, chat templates that try to run code).

Every file is generated here (nothing binary is committed), written to disk and opened the way
the daemon opens a model; each must be refused with the documented error class and a message
naming what is wrong, fast and without allocating what the file claims.
"""
import os
import resource
import time

import pytest

import gguf_bytes as gb
from hardening_files import (ARCH, READER_CASES, TOKENIZER_CASES, TOKENS, kv_u32, llama_file, one_tensor,
                             tokenizer_kvs)
from edged.errors import (ModelFormatError, TemplateError, TokenizerError,
                          UnsupportedModelError)
from edged.format.gguf import GGUFFile, Key

def write(tmp_path, name, data):
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(data)
    return str(p)


@pytest.fixture(autouse=True)
def bounded_memory():
    """A file that makes a loader allocate what it claims fails the test instead of the machine:
    2 GiB of address space more than the test process already has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("name,data,pattern", READER_CASES, ids=[c[0] for c in READER_CASES])
def test_reader_refuses(tmp_path, name, data, pattern):
    path = write(tmp_path, name, data)
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match=pattern) as e:
        GGUFFile.open(path).close()
    assert time.perf_counter() - t0 < 1.0
    assert path in str(e.value)             # the message names the file


def test_control_files_are_accepted(tmp_path):
    """The corpus corrupts valid files: the uncorrupted versions load."""
    with GGUFFile.open(write(tmp_path, "ok", one_tensor([8]))) as f:
        assert f.tensors["t"].nbytes == 32
    with GGUFFile.open(write(tmp_path, "llama", llama_file())) as f:
        assert f.metadata[Key.arch(Key.BLOCK_COUNT, ARCH)] == 1


# --- engine load: hyperparameters ---------------------------------------------------------------

arch = pytest.importorskip("edged.engine.arch")


def validate(path):
    """The engine's load-time validation (what Model.load runs after the tokenizer)."""
    with GGUFFile.open(path) as f:
        return arch.validate(f.metadata, f.tensors, len(TOKENS))


@pytest.mark.parametrize("block_count", [513, 4096, 2**31, 2**40, 2**64 - 1])
def test_engine_refuses_block_count_over_512(tmp_path, block_count):
    path = write(tmp_path, f"blocks-{block_count}", llama_file(block_count=block_count))
    t0 = time.perf_counter()
    with pytest.raises(UnsupportedModelError, match=r"block_count .*512"):
        validate(path)
    assert time.perf_counter() - t0 < 1.0


def test_engine_accepts_the_control_model(tmp_path):
    spec = validate(write(tmp_path, "ok", llama_file()))
    assert spec.hp.n_layer == 1 and len(spec.layers) == 1


@pytest.mark.parametrize("key,value,pattern", [
    (Key.HEAD_COUNT, 0, "head_count must be positive"),
    (Key.HEAD_COUNT, 2**32 - 1, "key_length|head"),
    (Key.EMBEDDING_LENGTH, 2**32 - 1, "embedding_length|key_length|token_embd.weight"),
])
def test_engine_refuses_absurd_hyperparameters(tmp_path, key, value, pattern):
    data = llama_file()
    a = Key.arch(key, ARCH)
    old = kv_u32(a, 2 if key == Key.HEAD_COUNT else 8)
    assert data.count(old) == 1
    path = write(tmp_path, "hp", data.replace(old, kv_u32(a, value)))
    with pytest.raises(UnsupportedModelError, match=pattern):
        validate(path)


# --- tokenizer ----------------------------------------------------------------------------------

def tokenizer_or_skip():
    try:
        from edged.text.tokenizer import Tokenizer
    except ImportError:
        pytest.skip("edged.text.tokenizer is not on this branch yet (text)")
    return Tokenizer




@pytest.mark.parametrize("name,kw,pattern", TOKENIZER_CASES, ids=[c[0] for c in TOKENIZER_CASES])
def test_tokenizer_refuses(tmp_path, name, kw, pattern):
    Tokenizer = tokenizer_or_skip()
    path = write(tmp_path, name, llama_file(tok_kvs=tokenizer_kvs(**kw)))
    with pytest.raises((TokenizerError, ModelFormatError), match=pattern):
        Tokenizer.from_gguf(path)


def test_tokenizer_bos_id_out_of_range(tmp_path, caplog):
    """An out-of-range special id is refused or ignored with a warning (llama.cpp ignores it);
    it never reaches the token stream."""
    Tokenizer = tokenizer_or_skip()
    kvs = [k for k in tokenizer_kvs() if not k.startswith(gb.s(Key.BOS_ID))] + [kv_u32(Key.BOS_ID, 2**31)]
    path = write(tmp_path, "bos", llama_file(tok_kvs=kvs))
    try:
        tok = Tokenizer.from_gguf(path)
    except TokenizerError as e:
        assert str(2**31) in str(e)
        return
    assert str(2**31) in caplog.text                    # the warning names the value
    assert tok.bos_id is None or 0 <= tok.bos_id < tok.n_vocab
    assert all(0 <= i < tok.n_vocab for i in tok.encode("a a", add_special=True))


# --- chat templates: untrusted code from the file -----------------------------------------------

ATTACKS = [
    ("mro-subclasses", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    ("globals-os", "{{ cycler.__init__.__globals__.os.popen('id').read() }}"),
    ("self-init-globals", "{{ self.__init__.__globals__.__builtins__.__import__('os').system('id') }}"),
    ("lipsum-globals", "{{ lipsum.__globals__['os'].popen('id').read() }}"),
    ("namespace-mutation", "{% set x = {} %}{{ x.update({'a': 1}) }}{{ x }}"),
    ("format-string-attr", "{{ '{0.__class__}'.format(messages) }}"),
    ("huge-range", "{% for i in range(10**9) %}x{% endfor %}"),
    ("huge-string", "{{ 'x' * 10**10 }}"),
    ("deep-recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
    # found by tools/fuzz.py chat: the parser's own recursion, before any sandbox check
    ("deep-nesting-parse", "={" + "{" * 120 + " messages[0].content }"),
    ("deep-parentheses", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"),
]


@pytest.mark.parametrize("name,template", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_chat_template_attack_is_refused(tmp_path, name, template):
    try:
        from edged.text import chat
    except ImportError:
        pytest.skip("edged.text.chat is not on this branch yet (text)")
    marker = tmp_path / "pwned"
    template = template.replace("'id'", f"'touch {marker}'")
    t0 = time.perf_counter()
    with pytest.raises(TemplateError):
        chat.render(template, [{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 5.0
    assert not marker.exists()


def test_chat_template_from_the_file_is_sandboxed(tmp_path):
    try:
        from edged.text import chat
    except ImportError:
        pytest.skip("edged.text.chat is not on this branch yet (text)")
    marker = tmp_path / "pwned"
    evil = "{{ cycler.__init__.__globals__.os.popen('touch %s').read() }}" % marker
    path = write(tmp_path, "evil-template", llama_file(extra_kvs=[gb.kv_str(Key.CHAT_TEMPLATE, evil)]))
    with GGUFFile.open(path) as f:
        template = chat.chat_template_from(f)
    assert template == evil
    with pytest.raises(TemplateError):
        chat.render(template, [{"role": "user", "content": "hi"}])
    assert not marker.exists()
