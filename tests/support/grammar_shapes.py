"""Hostile grammars and schemas (issue 41.1, 41.11) as grammar.constraint takes them, and a
runner that compiles them in a process of its own, so that a crash in llguidance's native code
fails a test instead of killing pytest.

    python tests/support/grammar_shapes.py [--mask-stack KIB] [--compile-stack BYTES] NAME...

prints one JSON line per case: {"name", "result": "compiled" | "GrammarError" | "<other
exception>", "message", "seconds"}. A compiled grammar then takes MASK_STEPS steps (mask,
consume, copy) on a thread with --mask-stack KiB of stack, as the daemon's decode thread would.
The cases compile from a thread of a ThreadPoolExecutor, as the daemon's handlers do.
"""
import json
import os
import sys
import threading
import time

CAP = 64 * 1024         # grammar.MAX_GRAMMAR_BYTES
MASK_STEPS = 8


def _names(n, upper):
    """n short distinct rule names: many rules in few bytes."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if upper else "abcdefghijklmnopqrstuvwxyz"
    out = []
    for i in range(n):
        s = ""
        while True:
            s += letters[i % 26]
            i //= 26
            if not i:
                break
        out.append(("X" if upper else "x") + s)
    return out


def lark_chain(n, upper=True):
    """The issue's reproduction: `start: T0`, `Ti: Ti+1 "x"`, `Tn: "y"` (terminals when upper)."""
    t = "T" if upper else "t"
    return "grammar", (f"start: {t}0\n" + "\n".join(f'{t}{i}: {t}{i + 1} "x"' for i in range(n))
                       + f'\n{t}{n}: "y"')


def gbnf_chain(n):
    """The issue's GBNF chain: `root ::= r0`, `ri ::= ri+1 "x"`; llguidance's converter turns
    it into a chain of terminals."""
    return "grammar", ("root ::= r0\n" + "\n".join(f'r{i} ::= r{i + 1} "x"' for i in range(n))
                       + f'\nr{n} ::= "y"')


def short_chain(n, upper=False, gbnf=False):
    """A chain with the shortest names: the most rules 64 KiB holds (6,600 Lark, 5,500 GBNF)."""
    names = _names(n + 1, upper)
    start, sep = ("root", "::=") if gbnf else ("start", ":")
    return "grammar", (f"{start}{sep}{names[0]}\n" + "\n".join(f"{a}{sep}{b}" for a, b in zip(names, names[1:]))
                       + f'\n{names[-1]}{sep}"y"')


def group_chain(n, k=28, upper=False):
    """A chain whose every rule nests k groups (Lark allows 29): the most stack per byte
    found, ~48 MiB for the 900 rules 64 KiB holds."""
    t = "T" if upper else "t"
    return "grammar", (f"start: {t}0\n" + "\n".join(
        f"{t}{i}: " + "(" * k + f'{t}{i + 1} "x"' + ")" * k for i in range(n)) + f'\n{t}{n}: "y"')


def gbnf_groups(n):
    return "grammar", "root ::= " + "(" * n + '"a" | "b"' + ")" * n


def lark_groups(n):
    return "grammar", "start: " + "(" * n + '"a" | "b"' + ")" * n


def wide_alternation(n):
    return "grammar", "start: " + " | ".join(f'"w{i}"' for i in range(n))


def template_nesting(n):
    return "grammar", "start: " + "a{" * n + '"x"' + "}" * n


def schema_items(n):
    s = {"type": "integer"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return "json_schema", s


def schema_any_of(n):
    s = {"type": "integer"}
    for _ in range(n):
        s = {"anyOf": [s, {"type": "string"}]}
    return "json_schema", s


def schema_ref_chain(n, k=0):
    """$defs d0 -> d1 -> ... -> dn, each reference under k levels of `properties`."""
    defs = {}
    for i in range(n):
        s = {"$ref": f"#/$defs/d{i + 1}"}
        for _ in range(k):
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
        defs[f"d{i}"] = s
    defs[f"d{n}"] = {"type": "integer"}
    return "json_schema", {"$ref": "#/$defs/d0", "$defs": defs}


def regex_groups(n):
    return "json_schema", {"type": "string", "pattern": "^" + "(" * n + "a" + ")" * n + "$"}


def largest(make, **kw):
    """make(n) with the largest n whose source fits the 64 KiB cap."""
    lo, hi = 1, 1
    while _size(make(hi, **kw)[1]) <= CAP:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _size(make(mid, **kw)[1]) <= CAP else (lo, mid)
    return make(lo, **kw)


def _size(source):
    return len(source.encode() if isinstance(source, str) else json.dumps(source).encode())


# name -> (kind, source). The first group are the issue's reproductions; the second the deepest
# grammars found that still fit the cap (what the stack must hold); the last numbers a 64-bit
# float cannot hold exactly, which llguidance clamped (41.11) or recursed on forever (-2**63).
CASES = {
    "lark_chain_3600": lambda: lark_chain(3600),
    "gbnf_chain_cap": lambda: largest(gbnf_chain),
    "schema_items_150": lambda: schema_items(150),
    "schema_any_of_150": lambda: schema_any_of(150),
    "lark_groups_40": lambda: lark_groups(40),
    "gbnf_groups_500": lambda: gbnf_groups(500),
    "wide_alternation_5000": lambda: wide_alternation(5000),
    "regex_groups_5000": lambda: regex_groups(5000),
    "template_nesting_cap": lambda: largest(template_nesting),
    "short_rule_chain_cap": lambda: largest(short_chain),
    "short_terminal_chain_cap": lambda: largest(short_chain, upper=True),
    "short_gbnf_chain_cap": lambda: largest(short_chain, gbnf=True),
    "group_chain_cap": lambda: largest(group_chain),
    "group_terminal_chain_cap": lambda: largest(group_chain, upper=True),
    "ref_chain_cap": lambda: largest(schema_ref_chain),
    "ref_chain_nested_cap": lambda: largest(schema_ref_chain, k=12),
    "integer_beyond_int64": lambda: ("json_schema", {"type": "integer", "minimum": 2**63, "maximum": 2**63 + 5}),
    "integer_at_int64_min": lambda: ("json_schema", {"type": "integer", "minimum": -2**63, "maximum": -2**63}),
    "const_int64_min": lambda: ("json_schema", {"const": -2**63}),
    "lark_json_const_int64_min": lambda: ("grammar", 'start: "n=" %json {"enum": [1, -9223372036854775808]}'),
    # found by tests/support/grammar_fuzz.py: llguidance 1.9 panics (pyo3's PanicException);
    # mask() looped forever forcing "z" (the greedy /z+/ takes every "z" the grammar needs)
    "regex_panic": lambda: ("grammar", "start: /((\\p{L}|(\\p{L}|\u00e9)))/"),
    "forced_forever": lambda: ("grammar", 'start: /z+/ "z"'),
    "forced_forever_gbnf": lambda: ("grammar", 'root ::= t0 "z" t0 "z"\nt0 ::= ("z")*'),
    # found by the fuzz: llguidance's lexer spends time and memory in proportion to a
    # multipleOf before its limits apply (2**31: past 20 s and 1.3 GB)
    "multiple_of_2_31": lambda: ("json_schema", {"type": "array", "items": {
        "multipleOf": 2147483648, "type": "integer"}, "x-guidance": {}}),
    "multiple_of_5_digit_primes": lambda: ("json_schema", {"type": "object", "properties": {
        f"p{i}": {"type": "integer", "multipleOf": p} for i, p in enumerate((99991, 99989, 99971))}}),
}
REPRODUCTIONS = ["lark_chain_3600", "gbnf_chain_cap", "schema_items_150", "schema_any_of_150",
                 "lark_groups_40", "gbnf_groups_500", "wide_alternation_5000", "regex_groups_5000",
                 "integer_beyond_int64", "integer_at_int64_min", "const_int64_min",
                 "lark_json_const_int64_min", "regex_panic", "forced_forever", "forced_forever_gbnf",
                 "multiple_of_2_31", "multiple_of_5_digit_primes"]
DEEPEST = [name for name in CASES if name.endswith("_cap")]
# a compile that fails at the end of a long chain (one error per level on the way back)
CASES["bad_chain_2000"] = lambda: ("grammar", lark_chain(2000)[1].rsplit("\n", 1)[0] + "\nT2000: UNDEFINED")


def _tokenizer():
    from edged.text.tokenizer import Tokenizer
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("EDGED_GRAMMAR_TOKENIZER") or os.path.join(root, "edged", "data", "stories260K.gguf")
    return Tokenizer.from_gguf(path)


def steps(constraint, tok, n=MASK_STEPS):
    """What the decode thread does with a choice: mask, consume an allowed token, and the copy
    a choice starts from; then the copy and the state are dropped."""
    import numpy as np
    c = constraint.copy()
    for _ in range(n):
        bits = np.unpackbits(c.mask().view(np.uint8), bitorder="little")[:tok.n_vocab]
        allowed = [t for t in np.flatnonzero(bits) if t not in tok.eog_ids]
        if not allowed:
            break
        c.consume(int(allowed[len(allowed) // 2]))
    del c


def on_thread(fn, stack, timeout):
    """fn() on a new thread with `stack` bytes of stack; TimeoutError if it runs past `timeout`
    seconds (native code cannot be stopped: the caller should end the process)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            out["error"] = e
    old = threading.stack_size(stack)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    threading.stack_size(old)
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"still running after {timeout} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


HANG_SECONDS = 20       # a compile, or MASK_STEPS steps, takes milliseconds to a second


def compile_case(kind, source, tok, mask_stack, pool):
    """{"result", "message", "seconds"} of one source; the process dies if llguidance does.
    "hang": a compile or a step that did not finish (its thread spins on: exit soon)."""
    from edged.errors import GrammarError
    from edged.text import grammar
    t0 = time.monotonic()
    try:
        c = pool.submit(grammar.constraint, kind, source, kind, tok).result(HANG_SECONDS)
        on_thread(lambda: steps(c, tok), mask_stack, HANG_SECONDS)
        return {"result": "compiled", "seconds": time.monotonic() - t0}
    except GrammarError as e:
        return {"result": "GrammarError", "message": str(e)[:300], "seconds": time.monotonic() - t0}
    except TimeoutError as e:       # concurrent.futures.TimeoutError too
        return {"result": "hang", "message": str(e), "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - reported, and fails the test
        return {"result": type(e).__name__, "message": str(e)[:300], "seconds": time.monotonic() - t0}


def main(argv):
    import argparse
    import concurrent.futures
    ap = argparse.ArgumentParser()
    ap.add_argument("--mask-stack", type=int, default=256, help="KiB of stack for the steps")
    ap.add_argument("--compile-stack", type=int, default=0, help="grammar.COMPILE_STACK, bytes")
    ap.add_argument("names", nargs="+")
    args = ap.parse_args(argv)
    from edged.text import grammar
    if args.compile_stack:
        grammar.COMPILE_STACK = args.compile_stack
    tok = _tokenizer()
    pool = concurrent.futures.ThreadPoolExecutor(1)       # not a with-block: a hung thread must not be joined
    for name in args.names:
        kind, source = CASES[name]()
        print(f"case {name}", file=sys.stderr, flush=True)      # the last one, if we crash
        out = compile_case(kind, source, tok, args.mask_stack << 10, pool)
        print(json.dumps(dict(out, name=name, bytes=_size(source))), flush=True)
        if out["result"] == "hang":
            os._exit(3)


if __name__ == "__main__":
    main(sys.argv[1:])
