#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris, libFuzzer) of what parses untrusted input.

    pip install atheris
    python tools/fuzz.py gguf -atheris_runs=200000          # GGUF reader, seeded with valid files
    python tools/fuzz.py chat -max_total_time=300            # chat-template renderer (text layer)
    python tools/fuzz.py tokenizer -max_total_time=300       # tokenizer encode/decode (text layer)

Everything after the target name goes to libFuzzer (-runs=N, -max_total_time=S, -jobs=N ...).
A crash is any exception other than the documented error class; libFuzzer then writes the
input to ./crash-* and the script exits non-zero. The hypothesis tests in
tests/test_hardening_fuzz.py cover the same properties in CI; this finds deeper paths.
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import atheris  # noqa: E402

with atheris.instrument_imports(include=["edged"]):
    from edged.errors import EdgedError, ModelFormatError, TemplateError, TokenizerError  # noqa: E402
    from edged.format.gguf import GGUFFile  # noqa: E402


def gguf_target(data):
    fd = os.memfd_create("fuzz", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        try:
            f = GGUFFile.from_fd(fd, name="fuzz.gguf")
        except ModelFormatError:
            return
    finally:
        os.close(fd)
    with f:
        for t in f.tensors.values():
            assert f.data_offset <= t.offset and t.offset + t.nbytes <= f.file_size
            assert len(f.tensor_bytes(t.name)) == t.nbytes


def gguf_seeds(corpus):
    import gguf_bytes as gb
    from hardening_files import llama_file, one_tensor
    seeds = [gb.valid_file(), gb.valid_file(version=2), llama_file(),
             one_tensor([64], gb.T_Q8_0, data=b"\0" * 68)]
    for i, s in enumerate(seeds):
        with open(os.path.join(corpus, f"seed-{i}.gguf"), "wb") as f:
            f.write(s)


def chat_target(data):
    with atheris.instrument_imports(include=["edged"]):
        from edged.text import chat
    fdp = atheris.FuzzedDataProvider(data)
    template = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 400))
    content = fdp.ConsumeUnicodeNoSurrogates(64)
    try:
        out = chat.render(template, [{"role": "user", "content": content}])
    except TemplateError:
        return
    assert isinstance(out, str)


def chat_seeds(corpus):
    for i, t in enumerate([
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}",
            "{{ bos_token }}{% if add_generation_prompt %}assistant:{% endif %}",
            "{{ messages[0].content.__class__ }}{{ raise_exception('x') }}"]):
        with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
            f.write(bytes([len(t) & 0xFF]) + t.encode())


_TOK = {}


def tokenizer_target(data):
    tok = _TOK["t"]
    text = data.decode("utf-8", "replace")
    try:
        ids = tok.encode(text, add_special=False)
    except TokenizerError:
        return
    assert tok.decode(ids) == text
    tok.decode([b % tok.n_vocab for b in data[:64]])


def tokenizer_setup():
    with atheris.instrument_imports(include=["edged"]):
        from edged.text.tokenizer import Tokenizer
    from hardening_files import llama_file, tokenizer_kvs
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a", "\u2581a"]
    types = [2, 3, 3] + [6] * 256 + [1, 1, 1]
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(llama_file(n_vocab=len(tokens), tok_kvs=tokenizer_kvs(tokens=tokens, types=types)))
        f.flush()
        _TOK["t"] = Tokenizer.from_gguf(f.name)


TARGETS = {"gguf": (gguf_target, gguf_seeds, None), "chat": (chat_target, chat_seeds, None),
           "tokenizer": (tokenizer_target, None, tokenizer_setup)}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(__doc__, file=sys.stderr)
        return 2
    target, seeds, setup = TARGETS[sys.argv[1]]
    if setup:
        setup()
    corpus = tempfile.mkdtemp(prefix=f"edged-fuzz-{sys.argv[1]}-")
    if seeds:
        seeds(corpus)
    atheris.Setup([sys.argv[0], *sys.argv[2:], corpus], target)
    atheris.Fuzz()


if __name__ == "__main__":
    sys.exit(main())
