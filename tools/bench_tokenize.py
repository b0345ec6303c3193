#!/usr/bin/env python3
"""Tokenizer encoding throughput: edged next to llama.cpp (through llama-cpp-python).

    python tools/bench_tokenize.py [--vocab NAME ...] [--repeat 3]
                                   [--llama-python /path/to/venv/bin/python]

Texts: "inp" is the long mixed-script test string of llama.cpp's vocab suite (the longest
`.inp` case) repeated to 256 KiB; "mixed" is 1 MiB of generated prose, code, numbers,
Cyrillic, CJK, emoji and whitespace runs (seeded, the same every run). Each figure is the best
of --repeat runs, in MB/s of UTF-8 input. llama.cpp runs in the interpreter given by
--llama-python (a venv with `pip install llama-cpp-python==0.3.36`), so edged never imports it;
both `Llama(vocab_only=True).tokenize` (which tokenizes twice when the text has more tokens
than the model's context) and one direct `llama_tokenize` call are reported. The ids of the
two implementations are compared as well.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB_DIR = os.path.join(HERE, "..", "..", "shared", "testdata", "vocab")
DEFAULT_VOCABS = ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm", "phi-3"]


def texts(vocab_path):
    raw = open(vocab_path + ".inp", encoding="utf-8", newline="").read()
    longest = max(raw.split("\n__ggml_vocab_test__\n")[:-1], key=len)
    inp = longest * (256 * 1024 // len(longest.encode()) + 1)
    rng = random.Random(1234)
    snippets = [
        "The quick brown fox jumps over the lazy dog. ", "It's 3.14159 and 2,718 apples; ",
        "def f(x):\n    return x ** 2  # square\n", "    \n\t\t", "Привет, как дела? ",
        "我想在apple工作，今天天气很好。", "\U0001F999\U0001F680 emoji \U0001F600 ",
        "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", "naïve café résumé Ångström ",
        "한국어 텍스트입니다. ", "x=[1,2,3]; y={'a': 1} ", "1234567890 ", "!!!??? ... --- ",
    ]
    parts, size = [], 0
    while size < 1 << 20:
        s = rng.choice(snippets)
        parts.append(s)
        size += len(s.encode())
    return {"inp": inp, "mixed": "".join(parts)}


def best_of(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_edged(path, repeat):
    sys.path.insert(0, os.path.join(HERE, ".."))
    from edged import Tokenizer
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(path)
    load = time.perf_counter() - t0
    res = {"load_s": load}
    for name, text in texts(path).items():
        dt, ids = best_of(lambda: tok.encode(text, add_special=False), repeat)
        res[name] = {"mb_s": len(text.encode()) / dt / 1e6, "n": len(ids), "hash": hash(tuple(ids))}
    return res


def run_llama(path, repeat):
    """Runs inside the llama-cpp-python interpreter."""
    import llama_cpp
    from llama_cpp import Llama
    t0 = time.perf_counter()
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    load = time.perf_counter() - t0
    vocab = llm._model.vocab
    res = {"load_s": load}
    for name, text in texts(path).items():
        data = text.encode()
        dt, ids = best_of(lambda: llm.tokenize(data, add_bos=False, special=False), repeat)
        buf = (llama_cpp.llama_token * (len(data) + 8))()

        def direct():
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(data) + 8, False, False)
            return list(buf[:n])

        dt2, ids2 = best_of(direct, repeat)
        assert ids2 == ids
        res[name] = {"mb_s": len(data) / dt / 1e6, "direct_mb_s": len(data) / dt2 / 1e6,
                     "n": len(ids), "hash": hash(tuple(ids))}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", nargs="*", default=DEFAULT_VOCABS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-python", help="interpreter with llama-cpp-python installed")
    ap.add_argument("--worker", choices=["llama"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_llama(args.path, args.repeat)))
        return
    print(f"{'vocab':14s} {'text':6s} {'edged MB/s':>11s} {'llama.cpp MB/s':>15s} "
          f"{'(direct call)':>14s} {'tokens':>8s} same ids")
    for name in args.vocab:
        path = os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf")
        ours = run_edged(path, args.repeat)
        theirs = None
        if args.llama_python:
            r = subprocess.run([args.llama_python, os.path.abspath(__file__), "--worker", "llama",
                                "--path", path, "--repeat", str(args.repeat)],
                               capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            if r.returncode != 0:
                sys.exit(f"llama.cpp worker failed:\n{r.stderr}")
            theirs = json.loads(r.stdout.strip().splitlines()[-1])
        for text in ("inp", "mixed"):
            o = ours[text]
            if theirs:
                t = theirs[text]
                same = "yes" if (t["n"], t["hash"]) == (o["n"], o["hash"]) else "NO"
                print(f"{name:14s} {text:6s} {o['mb_s']:11.2f} {t['mb_s']:15.2f} {t['direct_mb_s']:14.2f} "
                      f"{o['n']:8d} {same}")
            else:
                print(f"{name:14s} {text:6s} {o['mb_s']:11.2f} {'-':>15s} {'-':>14s} {o['n']:8d}")


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":            # stable hashes of the id lists
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "PYTHONHASHSEED": "0"})
    main()
