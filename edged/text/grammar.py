"""Structured output: a JSON schema, a Lark or GBNF grammar or a regular expression becomes a
per-token constraint whose mask the sampler applies before it draws (edged._core.sample_logits
takes the mask; the NumPy twin sample_reference too).

The grammar engine is llguidance (the engine llama.cpp can use; Rust core with x86-64 and
aarch64 wheels, ~8 MB installed): an Earley parser over a lexer that walks the vocabulary's
token trie; a mask over Qwen's 152k vocabulary took 0.5-0.9 ms on a loaded x86 machine
(BENCHMARKS.md). Writing our own would
be a second product. Compilation is bounded: the grammar text by MAX_GRAMMAR_BYTES and the
parser's work by llguidance's fuel limits (LIMITS), so a hostile schema fails with a
GrammarError naming what is wrong, never a hang.

A request's grammar goes through constraint(), which keeps llguidance's native code from taking
the daemon down (a crash or a hang there is one of the whole process):
- llguidance compiles rules, terminals and `$ref`s recursively, 2-130 KB of stack per level
  (a chain of 20 rules of 28 nested groups each needs 1 MiB), so a 64 KiB grammar can need
  ~50 MB of stack; a 3,600-rule chain overflowed a thread's 8 MiB. Compilation runs on a fresh
  thread with COMPILE_STACK bytes of stack (address space: a compile uses the pages it
  touches, which glibc gives back when the thread ends).
- What no stack holds is refused before llguidance sees it (_check_schema): an integer range
  at -2**63 recursed forever, and bounds beyond 64-bit floats were silently clamped, so the
  numbers of a schema must lie within +-MAX_EXACT; nesting deeper than MAX_JSON_DEPTH
  (llguidance's JSON parser stops at 128); `multipleOf` values whose significant digits add
  up to more than MAX_MULTIPLE (llguidance spends time and memory in proportion to them before
  its own limits apply: 2**31 ran on past 20 s and 1.3 GB).
- A compile still running after COMPILE_SECONDS is given up: the request gets a GrammarError
  and the next compile goes ahead (native code cannot be stopped, so its thread runs on in the
  background, releasing the GIL; edged_grammar_compiles_abandoned_total in /metrics counts them).
- mask() and consume() on the decode thread do not recurse with the grammar's depth (the
  deepest grammars under the size cap step on a 256 KiB stack); grammars from clients compile
  without byte forcing, which looped forever in mask() (from_lark); a Rust panic becomes a
  GrammarError (_panics).
tests/text/test_grammar_hardening.py holds the measurements and a fuzz over grammar shapes.

A Constraint is per choice (mutable parser state); the compiled grammar and the tokenizer view
are shared per model.
"""
import contextlib
import decimal
import json
import os
import re
import threading
import weakref

import numpy as np

from ..errors import CapacityError, GrammarError

# llguidance reports errors with anyhow, which captures a backtrace per error when
# RUST_BACKTRACE is set; a compile that fails deep in a chain makes one per level: a 2,000-rule
# chain ending in an unknown name took 39 s instead of 3 ms. Read once, so set before any error.
os.environ.setdefault("RUST_LIB_BACKTRACE", "0")

try:
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark, is_lark_syntax
except ImportError:  # an install without the structured-output dependency
    llguidance = None

MAX_GRAMMAR_BYTES = 64 * 1024       # schema / grammar text of one request
COMPILE_STACK = 256 << 20           # stack of the compiling thread: 4x the most a 64 KiB grammar took
COMPILE_SECONDS = 30                # a compile takes milliseconds to a second on x86 (the fuzz's cases)
MAX_JSON_DEPTH = 100                # lists/objects in lists/objects, in a schema or a tool call
MAX_MULTIPLE = 100_000              # a schema's multipleOf values, significant digits summed (see _multiple_cost)
MAX_EXACT = 2 ** 53                 # numbers in a schema: llguidance holds them as 64-bit floats
# llguidance's parser limits (its defaults are 5-10x larger): building the lexer and each
# mask step have a fuel budget; the grammar a bounded number of symbols.
LIMITS = dict(initial_lexer_fuel=400_000, step_lexer_fuel=200_000, step_max_items=50_000,
              max_lexer_states=50_000, max_grammar_size=100_000, max_items_in_row=2000,
              verbose_errors=False)

# JSON is written as json.dumps writes it ({"a": 1, "b": [2, 3]}): the layout models see in
# their templates, and no room for a small model to loop on white space.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# What llama.cpp's schema converter bounds and llguidance does not (see llama_like): digits of
# an integer (16 there: [1-9][0-9]{0,15}; +-2**53 here, 16 digits that a float64 holds
# exactly) and of a number's fraction (16 there; 10 here, the most llguidance's `multipleOf`
# takes as a decimal).
INT_LIMIT = MAX_EXACT
MAX_DECIMALS = 10
FRACTION = 10.0 ** -MAX_DECIMALS

_TOKENIZERS = weakref.WeakKeyDictionary()       # edged Tokenizer -> llguidance LLTokenizer
_TOKENIZERS_LOCK = threading.Lock()


def available():
    return llguidance is not None


def _require():
    if llguidance is None:
        raise GrammarError("structured output needs the 'llguidance' package, which is not installed")


def _limits():
    return llguidance.LLParserLimits(**LIMITS)


class _Vocab:
    """What llguidance's TokenizerWrapper reads: every token's bytes (control tokens marked
    with a leading 0xFF, as llguidance expects for specials), the end ids, and a tokenize
    function for the strings a grammar forces."""

    def __init__(self, tok, n_vocab):
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids, default=0)
        self.bos_token_id = tok.bos_id
        tokens, special = [], []
        for i in range(n_vocab):
            if i >= tok.n_vocab:                 # padding rows of the output matrix
                tokens.append(b"")
                continue
            piece = tok.token_piece(i)
            if tok.is_control(i):
                piece = b"\xff" + piece
                special.append(i)
            tokens.append(piece)
        self.tokens, self.special_token_ids = tokens, special
        self._tok = tok

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", "replace")
        # forced text continues a reply: no SentencePiece space prefix ("Once" is not " Once")
        return list(self._tok.encode(s, add_special=False, parse_special=False, space_prefix=False))


def lltokenizer(tok, n_vocab=None):
    """The llguidance view of an edged Tokenizer, built once per tokenizer (~1 s for 152k)."""
    _require()
    n_vocab = n_vocab or tok.n_vocab
    with _TOKENIZERS_LOCK:
        cached = _TOKENIZERS.get(tok)
        if cached is not None and cached.vocab_size == n_vocab:
            return cached
        llt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tok, n_vocab)),
                                     n_vocab=n_vocab, eos_token=sorted(tok.eog_ids) or None)
        _TOKENIZERS[tok] = llt
        return llt


# --- grammar sources -> llguidance grammars ------------------------------------------------

def constraint(kind, source, what, tok, n_vocab=None, trigger=None):
    """The Constraint (in its start state) of a request's grammar: kind "json_schema" (a schema),
    "grammar" (llama-server's field: GBNF or Lark text), "regex" (the whole reply matches it) or
    "lark" (llguidance's Lark, e.g. tools.call_grammar). Checked, then compiled on a thread of
    its own with COMPILE_STACK bytes of stack; GrammarError names `what` and the problem.
    trigger: a token id the grammar starts with; the constraint is then lazy (LazyConstraint)."""
    make = {"json_schema": from_json_schema, "grammar": from_grammar, "regex": from_regex,
            "lark": from_lark}[kind]
    lltokenizer(tok, n_vocab)
    with _panics(what):
        c = _on_compile_thread(what,
            lambda: Constraint(check(make(source, what), tok, n_vocab, what), tok, n_vocab, what))
    if trigger is None:
        return c
    # a trigger the grammar does not start with (a vocabulary whose marker is a plain token):
    # no constraint, as without one
    return LazyConstraint(c, trigger) if _allows(c.mask(), trigger) else None


def _allows(mask, token):
    return bool(mask[token >> 5] & (1 << (token & 31)))


@contextlib.contextmanager
def _panics(what):
    """A panic in llguidance's Rust code arrives as pyo3's PanicException, a BaseException that
    the handlers' and the decode thread's `except Exception` let through (seen: the regex
    `((\\p{L}|(\\p{L}|é)))`): a GrammarError instead."""
    try:
        yield
    except Exception:
        raise
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise GrammarError(f"{what}: llguidance failed on it ({e})") from None


_COMPILE_LOCK = threading.Lock()
ABANDONED = [0]                     # compiles given up after COMPILE_SECONDS (their threads run on)


def _on_compile_thread(what, fn):
    """fn() on a new thread with COMPILE_STACK bytes of stack; its result or its exception.
    GrammarError if it runs past COMPILE_SECONDS (the thread is left to finish on its own)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = e

    with _COMPILE_LOCK:         # threading.stack_size is process-wide
        old = threading.stack_size(COMPILE_STACK)
        try:
            t = threading.Thread(target=run, name="edged-grammar", daemon=True)
            t.start()
        except RuntimeError as e:
            raise CapacityError(f"cannot start a thread to compile the grammar "
                                f"({COMPILE_STACK >> 20} MiB of stack): {e}") from None
        finally:
            threading.stack_size(old)
    t.join(COMPILE_SECONDS)
    if t.is_alive():
        ABANDONED[0] += 1
        raise GrammarError(f"{what} did not compile within {COMPILE_SECONDS} s; simplify it "
                           f"(fewer rules, alternatives or counted repetitions)")
    if "error" in out:
        raise out.pop("error")
    return out["value"]


def _check_size(what, text):
    if len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"{what} is larger than {MAX_GRAMMAR_BYTES} bytes")


def _nodes(value, path=""):
    """(path, depth, value) of every part of a parsed JSON value, e.g. (".items[0]", 3, {...});
    iterative, so any depth is walked."""
    stack = [(path, 1, value)]
    while stack:
        path, depth, v = stack.pop()
        yield path, depth, v
        if isinstance(v, dict):
            stack.extend((f"{path}.{k}", depth + 1, x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", depth + 1, x) for i, x in enumerate(v))


def too_deep(value, limit=MAX_JSON_DEPTH):
    """The path of a list or object nested more than `limit` deep in a parsed JSON value ("" for
    the value itself), else None. Iterative; walks the lists and objects only (a request may
    hold a large flat array)."""
    stack = [("", 1, value)] if isinstance(value, (dict, list)) else []
    while stack:
        path, depth, v = stack.pop()
        if depth > limit:
            return path
        items = v.items() if isinstance(v, dict) else enumerate(v)
        fmt = "{}.{}" if isinstance(v, dict) else "{}[{}]"
        stack.extend((fmt.format(path, k), depth + 1, x) for k, x in items if isinstance(x, (dict, list)))
    return None


def _check_schema(schema, what):
    """Refuse what llguidance cannot hold exactly (see the module docstring)."""
    path = too_deep(schema)
    if path is not None:
        raise GrammarError(f"{what}: nested too deeply (more than {MAX_JSON_DEPTH} levels, "
                           f"at '...{path[-60:]}')")
    cost = 0
    for path, _, v in _nodes(schema):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and \
                not (-MAX_EXACT <= v <= MAX_EXACT):      # NaN too; an int is compared exactly
            key, shown = path.rsplit(".", 1)[-1] or "the schema", str(v)
            shown = shown if len(shown) <= 40 else shown[:30] + f"... ({len(shown)} digits)"
            raise GrammarError(f"{what}: '{key}' is {shown} (at '{path}'); numbers in a JSON schema must "
                               f"lie within +-{MAX_EXACT} (2**53), which 64-bit floats hold exactly")
        if path.endswith(".multipleOf") and isinstance(v, (int, float)) and not isinstance(v, bool):
            cost += _multiple_cost(v, path, what)
            if cost > MAX_MULTIPLE:
                raise GrammarError(f"{what}: its 'multipleOf' values add up to more than edged compiles "
                                   f"(at '{path}'): their significant digits (0.25 -> 25, 15000 -> 15) "
                                   f"may add up to {MAX_MULTIPLE}")


def _multiple_cost(v, path, what):
    """What a `multipleOf` costs llguidance's lexer: the value's significant digits read as a
    number (0.25 -> 25, 15000 -> 15). It builds one in time and memory that grow with that
    before its expression limit can refuse it: 999983 took 2 s and 180 MB to be refused,
    2**24 and 2**31 ran on past 20 s and 1.3 GB, twenty 5-digit primes took 8 s and 490 MB.
    Trailing zeros cost nothing (10**9 is quick)."""
    sign, digits, exponent = decimal.Decimal(repr(v) if isinstance(v, float) else v).normalize().as_tuple()
    cost = int("".join(map(str, digits)))
    if sign or not cost or cost > MAX_MULTIPLE:
        raise GrammarError(f"{what}: 'multipleOf' is {v} (at '{path}'); it must be positive, and its "
                           f"significant digits (0.25 -> 25, 15000 -> 15) at most {MAX_MULTIPLE}")
    if exponent < -MAX_DECIMALS:        # llguidance reads 1e-11 as 9999999999999998e-27
        raise GrammarError(f"{what}: 'multipleOf' is {v} (at '{path}'); it may have at most "
                           f"{MAX_DECIMALS} decimals")
    return cost


_JSON_BLOCK = re.compile(r"%json\s*")


def _check_lark(text, what):
    """The size, and the JSON schemas a Lark grammar holds (`%json {...}`)."""
    _check_size(what, text)
    decoder = json.JSONDecoder()
    for m in _JSON_BLOCK.finditer(text):
        try:
            schema = decoder.raw_decode(text, m.end())[0]
        except ValueError:
            continue                    # not JSON after all (e.g. in a string): llguidance says
        except RecursionError:
            raise GrammarError(f"{what}: a %json schema nested too deeply (more than "
                               f"{MAX_JSON_DEPTH} levels)") from None
        _check_schema(schema, f"{what}: %json at {m.start()}")


# GBNF, one lexeme at a time: a string, a character class, a comment, a name (and whether it is
# being defined: `name ::=`), or any other character.
_GBNF_LEXEME = re.compile(r'"(?:\\.|[^"\\])*"?|\[(?:\\.|[^\]\\])*\]?|#[^\r\n]*'
                          r'|([\w-]+)[ \t]*(::=)?|[\s\S]')


def _gbnf_dependency_order(text):
    """The rules of a GBNF grammar reordered so that each follows the rules it refers to (a
    grammar means the same in any order). llguidance's GBNF-to-Lark converter finds the rules
    that can be lexer terminals in passes over the rules in their order, one link of a chain
    per pass: a 5,500-rule chain written top-down took 3.3 s (quadratic; 27 s in the issue);
    in this order two passes do. A name defined twice keeps its last definition, as there."""
    head, rules, refs, name = "", {}, {}, None
    start, fresh = 0, True                      # fresh: nothing but blanks since a line began
    for m in _GBNF_LEXEME.finditer(text):
        if m.group(2) and fresh:                # `name ::=` opening a line: a new rule
            if name is None:
                head = text[:m.start()]
            else:
                rules[name] = text[start:m.start()]
            name, start = m.group(1), m.start()
            refs[name] = []
        elif m.group(1) and name is not None:
            refs[name].append(m.group(1))
        fresh = m.group() in ("\n", "\r") or (fresh and m.group() in (" ", "\t"))
    if name is None:
        return text
    rules[name] = text[start:]
    order, seen = [], set()
    for root in rules:                          # depth-first, each rule after its references
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(refs[root]))]
        while stack:
            for ref in stack[-1][1]:
                if ref in rules and ref not in seen:
                    seen.add(ref)
                    stack.append((ref, iter(refs[ref])))
                    break
            else:
                order.append(stack.pop()[0])
    return head + "".join(r if r.endswith(("\n", "\r")) else r + "\n" for r in map(rules.get, order))


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SUB_SCHEMA = ("items", "additionalProperties", "additionalItems", "unevaluatedProperties",
               "unevaluatedItems", "not", "contains", "propertyNames", "if", "then", "else")
_SUB_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUB_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def llama_like(schema):
    """`schema` (a parsed JSON schema) as llama.cpp's converter
    (common/json-schema-to-grammar.cpp) reads it, for the parts llguidance reads otherwise;
    a copy, the input is left as it is. The one place edged rewrites a client's schema:
    - an object schema with `properties` and no `additionalProperties` is closed
      (`additionalProperties: false`), as there; without `properties` it stays any object.
      pydantic's schemas leave the key out, and an open object lets a small model add keys
      until max_tokens. Not the direct members of an `allOf`, which are merged parts.
    - an integer without `minimum` (`exclusiveMinimum`) or `maximum` gets -INT_LIMIT /
      INT_LIMIT: at most 16 digits (llama.cpp: 16); unbounded, a small model wrote
      "11112222323333..." until max_tokens.
    - a number gets the same bounds, and `multipleOf` FRACTION (at most 10 decimals; llama.cpp:
      16) unless it has its own. Neither where `const` or `enum` already bounds the value.
    White space needs no rewrite: JSON_LAYOUT allows json.dumps's separators only.
    A schema nested deeper than MAX_JSON_DEPTH is returned as it is (_check_schema refuses it)."""
    if too_deep(schema) is not None:
        return schema
    return _llama_like(schema)


def _llama_like(schema, part_of_all_of=False):
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, v in schema.items():
        if key in _SUB_MAPS and isinstance(v, dict):
            v = {name: _llama_like(x) for name, x in v.items()}
        elif key in _SUB_LISTS and isinstance(v, list):
            v = [_llama_like(x, key == "allOf") for x in v]
        elif key in _SUB_SCHEMA:
            v = _llama_like(v)
        out[key] = v
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "properties" in schema and not part_of_all_of and "additionalProperties" not in schema \
            and "unevaluatedProperties" not in schema:
        out["additionalProperties"] = False
    if types & {"integer", "number"} and "const" not in schema and "enum" not in schema:
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            out["minimum"] = -INT_LIMIT
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            out["maximum"] = INT_LIMIT
        if "number" in types and "multipleOf" not in schema:
            out["multipleOf"] = FRACTION
    return out


def from_json_schema(schema, what="json_schema"):
    """A grammar for JSON text that validates against `schema` (a dict; True/{} = any JSON
    object), read as llama.cpp reads it (llama_like)."""
    _require()
    if schema is True or schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError(f"{what}: a JSON schema must be an object (got {type(schema).__name__})")
    _check_schema(schema, what)
    _check_size(what, json.dumps(schema))
    text = json.dumps(llama_like(schema))
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
    except ValueError as e:
        raise GrammarError(f"{what}: {e}") from None


def from_grammar(text, what="grammar"):
    """A grammar from llama-server's `grammar` field: GBNF (`root ::= ...`) or Lark. Compiled
    without byte forcing (see from_lark)."""
    _require()
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{what} must be a non-empty string")
    if not is_lark_syntax(text):
        _check_size(what, text)
        try:
            text = gbnf_to_lark(_gbnf_dependency_order(text))
        except Exception as e:  # noqa: BLE001 - the converter raises whatever its parser meets
            raise GrammarError(f"{what}: GBNF: {e}") from None
    return from_lark(text, what, forcing=False)


def from_regex(text, what="regex"):
    """A grammar whose whole text matches the regular expression `text` (Python / Rust regex
    syntax), compiled as a client's grammar (no byte forcing, see from_lark)."""
    _require()
    if not isinstance(text, str) or not text:
        raise GrammarError(f"{what} must be a non-empty string")
    _check_size(what, text)
    try:
        lark = "start: /" + llguidance.regex_to_lark(text, "") + "/\n"
    except Exception as e:  # noqa: BLE001 - the converter raises what its parser meets
        raise GrammarError(f"{what}: {e}") from None
    return from_lark(lark, what, forcing=False)


def from_lark(text, what="grammar", forcing=True):
    """A grammar from llguidance's Lark. Where the grammar allows one byte only, llguidance
    `forces` it (the text goes in as its canonical tokens); but a grammar whose lexer can only
    ever continue with one byte (`start: /z+/ "z"`: the greedy /z+/ takes every "z") made
    that loop forever inside mask(), on the decode thread (llguidance 1.9, force_bytes). So
    grammars from clients compile with forcing=False (the model picks the tokens of forced
    text); schemas and the tool-call grammars, which llguidance and edged lay out, keep it."""
    _require()
    _check_lark(text, what)
    return llguidance.LLMatcher.grammar_from_lark(text if forcing else _NO_FORCING + text)


_NO_FORCING = '%llguidance {"no_forcing": true}\n'


def check(grammar, tok, n_vocab=None, what="grammar"):
    """Compile once against the tokenizer (bounded by LIMITS); raises GrammarError naming the
    problem. Returns the grammar for Constraint."""
    _require()
    llt = lltokenizer(tok, n_vocab)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, llt, limits=_limits())
    if is_error:
        raise GrammarError(f"{what}: {messages[0] if messages else 'invalid'}")
    return grammar


class Constraint:
    """The parser state of one choice: mask() before each draw, consume(token) after it."""

    def __init__(self, grammar, tok, n_vocab=None, what="grammar"):
        _require()
        self.n_vocab = n_vocab or tok.n_vocab
        self.what = what
        self._m = llguidance.LLMatcher(lltokenizer(tok, self.n_vocab), grammar, log_level=0,
                                       limits=_limits())
        self._fail()
        # (ceil(n_vocab / 32),) bit i of word i // 32: token i allowed
        self._mask = np.zeros((self.n_vocab + 31) // 32, np.uint32)

    def _fail(self):
        if self._m.is_error():
            raise GrammarError(f"{self.what}: {self._m.get_error()}")

    def mask(self):
        """uint32 bitmask of the tokens allowed next (the end tokens once the grammar may stop)."""
        with _panics(self.what):
            self._m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._fail()
        return self._mask

    def consume(self, token):
        with _panics(self.what):
            self._m.consume_token(int(token))
        self._fail()

    def is_accepting(self):
        return self._m.is_accepting()

    def copy(self):
        c = object.__new__(Constraint)
        c.n_vocab, c.what, c._m = self.n_vocab, self.what, self._m.deep_copy()
        c._mask = np.zeros_like(self._mask)
        return c


class LazyConstraint:
    """A grammar that holds from a trigger token on, as llama.cpp's lazy grammars: until the
    model writes `trigger` any token goes (tool_choice "auto": it may answer in text), the
    trigger starts `start` (a Constraint whose grammar begins with it) and the rest of the reply
    follows that grammar (the call's arguments match their schema)."""

    def __init__(self, start, trigger):
        self.start, self.trigger = start, int(trigger)
        self.active = None          # the Constraint once triggered
        self.what = start.what

    def mask(self):
        """None (no restriction) until triggered, then the grammar's mask."""
        return None if self.active is None else self.active.mask()

    def consume(self, token):
        if self.active is None:
            if token != self.trigger:
                return
            self.active = self.start.copy()
        self.active.consume(token)

    def is_accepting(self):
        return self.active is None or self.active.is_accepting()

    def copy(self):
        c = object.__new__(LazyConstraint)
        c.start, c.trigger, c.what = self.start, self.trigger, self.what
        c.active = None if self.active is None else self.active.copy()
        return c
