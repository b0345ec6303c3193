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

A Constraint is per choice (mutable parser state); the compiled grammar and the tokenizer view
are shared per model.
"""
import json
import threading
import weakref

import numpy as np

from ..errors import GrammarError

try:
    import llguidance
except ImportError:  # an install without the structured-output dependency
    llguidance = None

MAX_GRAMMAR_BYTES = 64 * 1024       # schema / grammar text of one request
# llguidance's parser limits (its defaults are 5-10x larger): building the lexer and each
# mask step have a fuel budget; the grammar a bounded number of symbols.
LIMITS = dict(initial_lexer_fuel=400_000, step_lexer_fuel=200_000, step_max_items=50_000,
              max_lexer_states=50_000, max_grammar_size=100_000, max_items_in_row=2000,
              verbose_errors=False)

# JSON is written as json.dumps writes it ({"a": 1, "b": [2, 3]}): the layout models see in
# their templates, and no room for a small model to loop on white space.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

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

def _check_size(what, text):
    if len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"{what} is larger than {MAX_GRAMMAR_BYTES} bytes")


def from_json_schema(schema, what="json_schema"):
    """A grammar for JSON text that validates against `schema` (a dict; True/{} = any JSON
    object)."""
    _require()
    if schema is True or schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError(f"{what}: a JSON schema must be an object (got {type(schema).__name__})")
    text = json.dumps(schema)
    _check_size(what, text)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
    except ValueError as e:
        raise GrammarError(f"{what}: {e}") from None


def from_grammar(text, what="grammar"):
    """A grammar from llama-server's `grammar` field: GBNF (`root ::= ...`) or Lark."""
    _require()
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{what} must be a non-empty string")
    _check_size(what, text)
    try:
        return llguidance.grammar_from("grammar", text)
    except ValueError as e:
        raise GrammarError(f"{what}: {e}") from None


def from_lark(text, what="grammar"):
    _require()
    _check_size(what, text)
    return llguidance.LLMatcher.grammar_from_lark(text)


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
        self._m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._fail()
        return self._mask

    def consume(self, token):
        self._m.consume_token(int(token))
        self._fail()

    def is_accepting(self):
        return self._m.is_accepting()

    def copy(self):
        c = object.__new__(Constraint)
        c.n_vocab, c.what, c._m = self.n_vocab, self.what, self._m.deep_copy()
        c._mask = np.zeros_like(self._mask)
        return c

