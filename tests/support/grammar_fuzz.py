"""A hypothesis search over grammar and schema shapes for grammar.constraint, run by
tests/text/test_grammar_hardening.py in a process of its own (a crash in llguidance ends this
process, not pytest):

    python tests/support/grammar_fuzz.py --seconds 30

Lark and GBNF grammars (long chains of rules and terminals, nested groups, wide alternations,
recursive references, counted repetitions up to 2**31, odd unicode), JSON schemas (deep
nesting, $ref chains and cycles, numbers at the int64 and float edges, patterns) and regexes.
Each input compiles from a worker thread as in the daemon; a compiled one then steps (mask,
consume, copy) on a 256 KiB stack. Anything but a Constraint or a GrammarError fails the
search (exit status 1); each input is written to stderr first, so a crash names it. The last
line of stdout is {"examples", "compiled", "refused"}.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import grammar_shapes

MASK_STACK = 256 << 10
BATCH = 40                  # examples per hypothesis run; runs repeat until the time is up

EDGE_NUMBERS = [0, 1, -1, 7, 2**31, -2**31 - 1, 2**53, 2**53 + 1, -2**53 - 1, 2**63 - 1, 2**63,
                -2**63, -2**63 - 1, 2**64, 10**30, 0.1, -2.5, 1e-300, 1e300, -1e308, 2.0**63]
COUNTS = st.one_of(st.integers(0, 5), st.sampled_from([0, 1, 100, 2000, 65535, 2**31 - 1, 2**31, 10**12]))
ODD = st.characters(blacklist_categories=("Cs",))          # any code point but lone surrogates
TEXT = st.text(ODD, max_size=8)
FEW = st.text("az", min_size=1, max_size=3)                # lexemes that overlap ("z+" then "z")


# --- regexes -----------------------------------------------------------------------------

def _regex_leaf():
    return st.one_of(
        st.sampled_from(["z+", "a*", "(az)+", "z?", "[az]+"]), FEW,
        st.sampled_from(["a", "b", ".", "\\d", "\\w", "\\s", "[a-z]", "[^\\n]", "\\p{L}", "\\p{Greek}",
                         "[\\u0000-\\U0010ffff]", "x*?", "\\x00", "\\u{1F600}", "é", "\u202e", "\U0001F600"]),
        TEXT.map(lambda s: "".join("\\" + c if c in "\\^$.|?*+()[]{}/" else c for c in s)))


REGEX = st.recursive(_regex_leaf(), lambda inner: st.one_of(
    st.lists(inner, min_size=2, max_size=4).map("".join),
    st.lists(inner, min_size=2, max_size=4).map(lambda xs: "(" + "|".join(xs) + ")"),
    st.tuples(inner, st.integers(1, 300)).map(lambda t: "(?:" * t[1] + t[0] + ")" * t[1]),
    st.tuples(inner, COUNTS, COUNTS).map(lambda t: f"(?:{t[0]}){{{min(t[1], t[2])},{max(t[1], t[2])}}}"),
    st.tuples(inner, st.sampled_from("*+?")).map(lambda t: f"(?:{t[0]}){t[1]}"),
), max_leaves=12)


# --- Lark and GBNF -----------------------------------------------------------------------

def _expr(names, gbnf):
    lit = st.one_of(FEW, TEXT).map(lambda s: json.dumps(s or "z", ensure_ascii=gbnf))
    leaf = st.one_of(lit, st.sampled_from(names),
                     st.sampled_from(["[a-z]", "[0-9]", "[^\"]", "."]) if gbnf else
                     REGEX.map(lambda r: "/" + r.replace("/", "\\/") + "/"))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=6).map(lambda xs: "(" + " | ".join(xs) + ")"),
        st.tuples(inner, st.integers(1, 40)).map(lambda t: "(" * t[1] + t[0] + ")" * t[1]),
        st.tuples(inner, st.sampled_from(["*", "+", "?"])).map(lambda t: f"({t[0]}){t[1]}"),
        st.tuples(inner, COUNTS, COUNTS).map(lambda t: f"({t[0]}){{{min(t[1], t[2])},{max(t[1], t[2])}}}"),
    ), max_leaves=10)


@st.composite
def rule_grammar(draw):
    """A few rules with references among them (cycles too), any case, Lark or GBNF."""
    gbnf = draw(st.booleans())
    n = draw(st.integers(1, 8))
    names = [draw(st.sampled_from(["r", "R", "t", "T"])) + str(i) for i in range(n)]
    if gbnf:
        names = [x.lower() for x in names]
    expr = _expr(names, gbnf)
    start, sep = ("root", " ::= ") if gbnf else ("start", ": ")
    rules = [f"{start}{sep}{draw(expr)}"] + [f"{x}{sep}{draw(expr)}" for x in names]
    if not gbnf and draw(st.booleans()):
        rules.append(f"{names[0].lower()}j: %json {json.dumps(draw(SCHEMA))}")
    return "grammar", "\n".join(rules)


@st.composite
def chain(draw):
    """n rules (or terminals) each referring to the next, under k groups, with a tail per link."""
    n = draw(st.one_of(st.integers(1, 50), st.integers(50, 8000)))
    k = draw(st.integers(0, 30))
    gbnf = draw(st.booleans())
    t = draw(st.sampled_from(["r", "T"])) if not gbnf else "r"
    tail = draw(st.sampled_from(['', ' "x"', ' | "z"', "?", ' "x"*']))
    start, sep = ("root", " ::= ") if gbnf else ("start", ": ")
    body = "\n".join(f"{t}{i}{sep}" + "(" * k + f"{t}{i + 1}{tail}" + ")" * k for i in range(n))
    return "grammar", f"{start}{sep}{t}0\n{body}\n{t}{n}{sep}" + draw(st.sampled_from(['"y"', "UNDEFINED", f"{t}0"]))


WIDE = st.integers(2, 6000).map(lambda n: ("grammar", "start: " + " | ".join(f'"w{i}"' for i in range(n))))


# --- JSON schemas ------------------------------------------------------------------------

def _number():
    edge = st.sampled_from(EDGE_NUMBERS)
    return st.one_of(edge, edge, edge, st.integers(), st.floats())


_SCHEMA_LEAF = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array")]),
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])},
                          optional={k: _number() for k in ("minimum", "maximum", "exclusiveMinimum",
                                                           "exclusiveMaximum", "multipleOf")}),
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"pattern": REGEX, "minLength": COUNTS, "maxLength": COUNTS,
                                    "format": st.sampled_from(["date-time", "email", "uuid", "ipv6", "x"])}),
    st.sampled_from(EDGE_NUMBERS).map(lambda v: {"type": "integer", "minimum": v, "maximum": v}),
    st.fixed_dictionaries({"const": st.one_of(_number(), TEXT)}),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(_number(), TEXT, st.none()), min_size=1, max_size=5)}),
    st.integers(0, 9).map(lambda i: {"$ref": f"#/$defs/d{i}"}),
)

SCHEMA = st.recursive(_SCHEMA_LEAF, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                          optional={"minItems": COUNTS, "maxItems": COUNTS}),
    st.fixed_dictionaries({"type": st.just("object"),
                           "properties": st.dictionaries(TEXT, inner, max_size=4)},
                          optional={"additionalProperties": st.one_of(st.booleans(), inner),
                                    "required": st.lists(TEXT, max_size=3)}),
    st.builds(lambda key, xs: {key: xs}, st.sampled_from(["anyOf", "allOf", "oneOf"]),
              st.lists(inner, min_size=1, max_size=4)),
    st.tuples(inner, st.integers(1, 130)).map(lambda t: _nest(t[0], t[1])),
), max_leaves=12)


def _nest(schema, depth):
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


LAYOUT = st.fixed_dictionaries({}, optional={      # llguidance's own layout options
    "whitespace_flexible": st.booleans(), "whitespace_pattern": REGEX,
    "item_separator": st.text("z1, :\n", max_size=3), "key_separator": st.text("z1, :\n", max_size=3)})


@st.composite
def schema_with_defs(draw):
    defs = {f"d{i}": draw(SCHEMA) for i in range(draw(st.integers(0, 10)))}
    root = draw(SCHEMA)
    if defs:
        root = dict(root, **{"$defs": defs})
    if draw(st.integers(0, 3)) == 0:
        root = dict(root, **{"x-guidance": draw(LAYOUT)})
    return "json_schema", root


@st.composite
def ref_chain(draw):
    n = draw(st.integers(1, 3000))
    k = draw(st.integers(0, 12))
    kind, schema = grammar_shapes.schema_ref_chain(n, k)
    if draw(st.booleans()):                         # close the chain into a cycle
        schema["$defs"][f"d{n}"] = {"$ref": "#/$defs/d0"}
    return kind, schema


INPUTS = st.one_of(rule_grammar(), chain(), WIDE, schema_with_defs(), ref_chain(),
                   REGEX.map(lambda r: ("json_schema", {"type": "string", "pattern": r})),
                   REGEX.map(lambda r: ("grammar", "start: /" + r.replace("/", "\\/") + "/")))


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--random", action="store_true",
                    help="fresh random inputs; without it batch i draws from seed i, so a run "
                         "repeats the inputs of any shorter run (what CI finds, you can replay)")
    args = ap.parse_args(argv)
    tok = grammar_shapes._tokenizer()
    counts = {"examples": 0, "compiled": 0, "refused": 0}
    deadline = time.monotonic() + args.seconds
    pool = concurrent.futures.ThreadPoolExecutor(1)

    @settings(max_examples=BATCH, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.target, Phase.shrink])
    @given(INPUTS)
    def batch(case):
        kind, source = case
        text = source if isinstance(source, str) else json.dumps(source)
        print(f"input {kind} ({len(text)} chars): {text[:2500]!r}", file=sys.stderr, flush=True)
        out = grammar_shapes.compile_case(kind, source, tok, MASK_STACK, pool)
        if out["result"] == "hang":             # a thread spins in native code: no shrinking
            print(f"HANG: {out['message']}; the input above", file=sys.stderr, flush=True)
            os._exit(3)
        counts["examples"] += 1
        if out["result"] == "compiled":
            counts["compiled"] += 1
        elif out["result"] == "GrammarError":
            counts["refused"] += 1
        else:
            raise AssertionError(f"{out['result']}: {out['message']}")

    n = 0
    while time.monotonic() < deadline:
        (batch if args.random else seed(n)(batch))()
        n += 1
    print(json.dumps(dict(counts, batches=n)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
