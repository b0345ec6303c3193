"""Tokenizers from GGUF metadata, the way llama.cpp reads them.

`tokenizer.ggml.model` picks the algorithm: "llama" is SentencePiece-style BPE over scores with
byte fallback; "gpt2" is byte-level BPE over `tokenizer.ggml.merges`, with the pre-tokenizer
(the word-splitting regexes) chosen by `tokenizer.ggml.pre`; "gemma4" is BPE over merges on
plain UTF-8 text (spaces as U+2581, `<0xXX>` byte fallback, always the "gemma4" pre-tokenizer); "bert" is WordPiece
(text/wordpiece.py: [CLS] ... [SEP], lowercasing as the GGUF says). Token types, special ids, the
end-of-generation set and the special-token partitioning follow llama.cpp's llama-vocab so
that ids match its own test suite. The splitting and merge loops are compiled (edged._bpe).

The metadata is untrusted: types, lengths, ids and byte tokens are checked at load and a bad
vocabulary is refused with a TokenizerError naming the key, the index and the value.
"""
import bisect
import codecs
import enum
import itertools
import logging
import re

import numpy as np

from ..errors import TokenizerError
from ..format.gguf import GGUFFile, Key
from .wordpiece import WordPiece

try:
    from .. import _bpe
except ImportError as e:        # pragma: no cover - a build problem, not a runtime condition
    raise ImportError("edged's compiled tokenizer core (edged._bpe) is missing: build it with "
                      "`python setup.py build_ext --inplace`") from e

log = logging.getLogger("edged.text.tokenizer")


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# token attributes (bit set), as llama.cpp derives them from the token types
A_UNKNOWN = 1 << 0
A_UNUSED = 1 << 1
A_NORMAL = 1 << 2
A_CONTROL = 1 << 3
A_USER_DEFINED = 1 << 4
A_BYTE = 1 << 5
A_LSTRIP = 1 << 7
A_RSTRIP = 1 << 8
_TYPE_ATTR = {TokenType.UNDEFINED: 0, TokenType.NORMAL: A_NORMAL, TokenType.UNKNOWN: A_UNKNOWN,
              TokenType.CONTROL: A_CONTROL, TokenType.USER_DEFINED: A_USER_DEFINED,
              TokenType.UNUSED: A_UNUSED, TokenType.BYTE: A_BYTE}

# --- pre-tokenizers --------------------------------------------------------------------------
# Each is a list of ops applied in turn (op, class, ranges); see cython_kernels/text/bpe.pyx.
(OP_GPT2, OP_LLAMA3, OP_QWEN2, OP_QWEN35, OP_RUN, OP_ONE, OP_WS_RUN, OP_TRAIL_WS, OP_DIGITS3,
 OP_NEWLINES, OP_GPT4O) = range(1, 12)
CL_N, CL_L, CL_P, CL_P_DEFAULT, CL_P_FALCON, CL_CRLF, CL_RANGES = range(1, 8)

# literal character classes of the deepseek-llm / deepseek-coder regexes, as code point ranges
DEEPSEEK_LETTERS = (
    (0x0041, 0x005A), (0x0061, 0x007A), (0x00B5, 0x00B5), (0x00C0, 0x00D6), (0x00D8, 0x00F6),
    (0x00F8, 0x01BA), (0x01BC, 0x01BF), (0x01C4, 0x0293), (0x0295, 0x02AF), (0x0370, 0x0373),
    (0x0376, 0x0377), (0x037B, 0x037D), (0x037F, 0x037F), (0x0386, 0x0386), (0x0388, 0x038A),
    (0x038C, 0x038C), (0x038E, 0x03A1), (0x03A3, 0x03F5), (0x03F7, 0x0481), (0x048A, 0x052F),
    (0x0531, 0x0556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107),
    (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F),
    (0x2145, 0x2149), (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8,
    0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
)
DEEPSEEK_PUNCT = (
    (0x0021, 0x002F), (0x003A, 0x007E), (0x2018, 0x201F), (0x3000, 0x3002), (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF5E),
)
CJK_HANGUL = (
    (0x0800, 0x9FA5), (0xAC00, 0xD7FF),
)

GPT2 = (OP_GPT2, 0, None)          # 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)


class PreSpec:
    """A pre-tokenizer: its ops and the vocabulary settings llama.cpp ties to its name."""

    def __init__(self, name, ops, ignore_merges=False, add_bos=None, no_bos=False, add_sep=False,
                 raw=False, newline_tokens=False, always_bos=False):
        self.name = name
        self.ops = ops
        self.ignore_merges = ignore_merges    # a word that is itself a token is not merged
        self.add_bos = add_bos                # default for add_bos (the GGUF key overrides it)
        self.no_bos = no_bos                  # the vocabulary has no BOS by default
        self.add_sep = add_sep                # default for add_sep (a pair's separator)
        # the vocabulary is plain UTF-8 text with U+2581 for spaces, not GPT-2 byte-level text
        # (llama.cpp's escape_whitespaces with byte_encode = false); bytes no token covers are
        # <0xXX> tokens
        self.raw = raw
        self.newline_tokens = newline_tokens  # a newline-only word that is a token stays whole
        self.always_bos = always_bos          # add_bos even where the GGUF says false


_DEFAULT = [(OP_RUN, CL_P_DEFAULT, None), GPT2, (OP_RUN, CL_N, None), (OP_DIGITS3, 0, None)]
_LLAMA3 = [(OP_LLAMA3, 0, None)]
_STARCODER = [(OP_ONE, CL_N, None), GPT2]
_GROUPS = [
    # names (`tokenizer.ggml.pre`)                              ops, settings
    (("default",), _DEFAULT, {}),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     _LLAMA3, dict(ignore_merges=True, add_bos=True)),
    (("dbrx", "smaug-bpe"), _LLAMA3, {}),
    (("chatglm-bpe",), _LLAMA3, dict(no_bos=True)),
    (("glm4", "glm5"), _LLAMA3, dict(no_bos=True, ignore_merges=True)),
    (("deepseek-llm",), [(OP_ONE, CL_CRLF, None), (OP_WS_RUN, CL_RANGES, DEEPSEEK_LETTERS),
                         (OP_WS_RUN, CL_RANGES, DEEPSEEK_PUNCT), (OP_TRAIL_WS, 0, None),
                         (OP_RUN, CL_RANGES, CJK_HANGUL), (OP_RUN, CL_N, None)], {}),
    (("deepseek-coder",), [(OP_ONE, CL_CRLF, None), (OP_WS_RUN, CL_L, None), (OP_WS_RUN, CL_P, None),
                           (OP_RUN, CL_RANGES, CJK_HANGUL), (OP_ONE, CL_N, None)], {}),
    (("falcon",), [(OP_RUN, CL_P_FALCON, None), GPT2, (OP_DIGITS3, 0, None)], {}),
    (("gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat", "jina-v2-es",
      "jina-v2-de", "a.x-4.0", "mellum", "trillion", "granite-docling", "exaone4"), [GPT2], {}),
    (("jina-v1-en", "jina-v2-code", "roberta-bpe"), [GPT2], dict(add_sep=True)),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _STARCODER, {}),
    (("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "solar-open", "kormo", "f2llmv2",
      "megrez", "grok-2"), [(OP_QWEN2, 0, None)], {}),
    (("qwen35",), [(OP_QWEN35, 0, None)], {}),
    (("laguna",), [(OP_NEWLINES, 0, None), (OP_QWEN2, 0, None)], {}),
    # o200k: gpt-oss, GPT-4o-style vocabularies (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O)
    (("gpt-4o", "llama4", "kanana2", "talkie"), [(OP_GPT4O, 0, None)], {}),
    # Gemma 4: no word splitting beyond newline runs; llama.cpp forces add_bos (its PR 21500)
    (("gemma4",), [(OP_NEWLINES, 0, None)],
     dict(add_bos=True, raw=True, newline_tokens=True, always_bos=True)),
]
PRE_TOKENIZERS = {name: PreSpec(name, ops, **kw) for names, ops, kw in _GROUPS for name in names}


class VocabRule:
    """What one tokenizer model adds around text, with llama.cpp's defaults."""

    def __init__(self, ids, add_bos, add_eos, add_sep, space_prefix, wordpiece=False):
        self.ids = ids                        # default special ids by slot
        self.add_bos, self.add_eos, self.add_sep = add_bos, add_eos, add_sep   # flag defaults
        self.space_prefix = space_prefix      # SentencePiece's leading space
        # encode(add_special): [BOS if add_bos] text [EOS if add_eos], or for WordPiece
        # [CLS] text [SEP] whatever the flags say
        self.wordpiece = wordpiece


# The special-token rules per `tokenizer.ggml.model`, as llama.cpp applies them (src/llama-vocab.cpp
# of the llama.cpp in llama-cpp-python 0.3.36):
# - defaults: llama_vocab::impl::load sets the ids and flags by model ("llama" SPM, "gpt2" BPE,
#   "bert" WPM), a "gpt2" pre-tokenizer may set add_bos (llama3, ...) or add_sep (jina-v1-en,
#   jina-v2-code, roberta-bpe) or drop the BOS (chatglm), then tokenizer.ggml.add_bos_token,
#   add_eos_token and add_sep_token override the flags;
# - one text: llama_vocab::impl::tokenize with add_special (SPM and UGM inline,
#   llm_tokenizer_bpe_session::append_bos/append_eos for BPE) adds BOS if add_bos and EOS if
#   add_eos; WPM adds [CLS] before and [SEP] after, always (the flags are not read there; the
#   current BERT converter writes add_sep false and add_eos true for [SEP]);
# - a pair (a reranker's query and document): format_prompt_rerank (tools/server/server-common.cpp)
#   builds [BOS if add_bos] a [EOS if add_eos] [SEP if add_sep] b [EOS if add_eos], with SEP
#   in the EOS places when the vocabulary has no EOS. See Tokenizer.encode_pair.
VOCAB_RULES = {
    "llama": VocabRule(dict(bos=1, eos=2, unk=0), add_bos=True, add_eos=False, add_sep=False,
                       space_prefix=True),
    "gpt2": VocabRule(dict(bos=11, eos=11), add_bos=False, add_eos=False, add_sep=False,
                      space_prefix=False),
    "bert": VocabRule(dict(bos=101, unk=100, sep=102, pad=0, mask=103), add_bos=True,
                      add_eos=False, add_sep=True, space_prefix=False, wordpiece=True),
    # BPE with the "gemma4" pre-tokenizer whatever tokenizer.ggml.pre says; ids only from the file
    "gemma4": VocabRule({}, add_bos=True, add_eos=False, add_sep=False, space_prefix=False),
}

# llama.cpp recognises these by their text (its issue 9606): tokens that end a generation ...
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
])
# ... the end-of-turn token when the file names none (the first of these texts it has) ...
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)
# ... fill-in-the-middle tokens (llama_vocab::impl::load, "find FIM_PRE token" ...) ...
_FIM_IO_TEXTS = {
    Key.FIM_PRE_ID: ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                     "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    Key.FIM_SUF_ID: ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                     "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    Key.FIM_MID_ID: ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                     "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
}
# ... and fill-in-the-middle tokens that also end a generation
_FIM_TEXTS = {
    Key.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    Key.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    Key.FIM_SEP_ID: ("<|file_sep|>",),
}
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss
_C_SPACE = " \t\n\v\f\r"        # what C's isspace() strips around special tokens
# Written by defuse() before the last character of control-token text in a chat message, so
# that encode(..., marked=True) of the rendered prompt keeps that text plain; a noncharacter
# (U+FDD0), dropped from the text it is found in.
CONTENT_MARK = "\ufdd0"


def _fail(name, msg):
    raise TokenizerError(f"{name}: {msg}")


class Tokenizer:
    """Text <-> token ids for one vocabulary. Immutable after load; safe to share."""

    @classmethod
    def from_gguf(cls, path, allow_unknown_pre=False):
        """Load from a GGUF file (a vocab-only file is enough)."""
        with GGUFFile.open(path) as f:
            return cls.from_gguf_file(f, allow_unknown_pre=allow_unknown_pre)

    @classmethod
    def from_gguf_file(cls, f, allow_unknown_pre=False):
        """Load from an open GGUFFile. `allow_unknown_pre`: an unknown `tokenizer.ggml.pre`
        falls back to "default" with a warning instead of being refused."""
        return cls(f.metadata, name=getattr(f, "name", "<gguf>"), allow_unknown_pre=allow_unknown_pre)

    def __init__(self, metadata, name="<metadata>", allow_unknown_pre=False):
        self.name = name
        md = metadata
        self.model = self._str(md, Key.TOKENIZER_MODEL, required=True)
        if self.model not in VOCAB_RULES:
            _fail(name, f"tokenizer model {self.model!r} ({Key.TOKENIZER_MODEL}) is not supported "
                        "(supported: 'llama' SentencePiece BPE, 'gpt2' byte-level BPE, 'gemma4' "
                        "BPE, 'bert' WordPiece)")
        self._read_tokens(md)
        attr = self._read_types(md)
        special, spec = self._read_settings(md, allow_unknown_pre)
        eog = self._end_of_generation(special, attr)
        self._order_specials(md, attr)
        rule = VOCAB_RULES[self.model]
        if rule.wordpiece:
            if special["unk"] is None or special["sep"] is None or special["bos"] is None:
                _fail(name, f"a 'bert' vocabulary needs an unknown token ({Key.UNK_ID}), a "
                            f"[CLS] ({Key.BOS_ID}) and a separator ({Key.SEP_ID})")
            self._first, self._last = [special["bos"]], [special["sep"]]
        else:
            if self.add_bos and special["bos"] is None:
                _fail(name, f"{Key.ADD_BOS} is set but the vocabulary has no BOS token")
            if self.add_eos and special["eos"] is None:
                _fail(name, f"{Key.ADD_EOS} is set but the vocabulary has no EOS token")
            self._first = [special["bos"]] if self.add_bos else []
            self._last = [special["eos"]] if self.add_eos else []
        self.bos_id, self.eos_id, self.eot_id = special["bos"], special["eos"], special["eot"]
        self.eom_id, self.unk_id, self.pad_id = special["eom"], special["unk"], special["pad"]
        self.sep_id, self.mask_id = special["sep"], special["mask"]
        # fill-in-the-middle: "pre", "suf", "mid", "pad", "rep", "sep" -> id or None
        self.fim = {name: special[key] for name, key in (
            ("pre", Key.FIM_PRE_ID), ("suf", Key.FIM_SUF_ID), ("mid", Key.FIM_MID_ID),
            ("pad", Key.FIM_PAD_ID), ("rep", Key.FIM_REP_ID), ("sep", Key.FIM_SEP_ID))}
        self.eog_ids = frozenset(eog)
        # pieces (token -> bytes), made on first use; byte tokens checked now
        self._pieces = [None] * self.n_vocab
        for i in np.nonzero(self._types == TokenType.BYTE)[0].tolist():
            self._make_piece(i)
        self._build_model(md, spec)

    # --- loading, step by step (each step reads the metadata it names) -------------------------
    def _read_tokens(self, md):
        """tokenizer.ggml.tokens -> self._text (texts, empty ones named), n_vocab, _id."""
        tokens = md.get(Key.TOKENS)
        if not isinstance(tokens, list) or not tokens or set(map(type, tokens)) != {str}:
            _fail(self.name, f"{Key.TOKENS} must be a non-empty array of strings")
        n = len(tokens)
        if n >= 1 << 31:
            _fail(self.name, f"{Key.TOKENS} has {n} entries (limit 2^31 - 1)")
        texts = tokens
        if "" in tokens:                               # llama.cpp names empty tokens like this
            texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._text = texts
        self.n_vocab = n
        self._id = dict(zip(texts, range(n)))
        if len(self._id) != n:
            seen = {}
            for i, t in enumerate(texts):
                if t in seen:
                    _fail(self.name, f"{Key.TOKENS}[{i}] {t[:40]!r} duplicates token {seen[t]}")
                seen[t] = i

    def _read_types(self, md):
        """Scores and token types -> self._scores, self._types; returns the attribute list."""
        n = self.n_vocab
        scores = self._array(md, Key.SCORES, n, ("f", "i"))
        self._scores = (np.zeros(n, np.float32) if scores is None else scores.astype(np.float32))
        types = self._array(md, Key.TOKEN_TYPE, n, ("i", "u"))
        if types is None:
            types = np.full(n, int(TokenType.NORMAL), np.int32)
        bad = np.nonzero((types < 0) | (types > 6))[0]
        if len(bad):
            _fail(self.name, f"{Key.TOKEN_TYPE}[{bad[0]}] = {types[bad[0]]} is not a token type (0..6)")
        self._types = types.astype(np.int32)
        return np.array([_TYPE_ATTR[TokenType(t)] for t in range(7)], np.int32)[self._types].tolist()

    def _read_settings(self, md, allow_unknown_pre):
        """Vocabulary settings as llama.cpp derives them from the model and pre-tokenizer: sets
        pre, add_space_prefix, add_bos, add_eos, add_sep; returns (special ids by slot, PreSpec
        or None)."""
        name, n = self.name, self.n_vocab
        special = {"bos": None, "eos": None, "unk": None, "sep": None, "pad": None, "mask": None,
                   "eot": None, "eom": None, Key.FIM_PAD_ID: None, Key.FIM_REP_ID: None,
                   Key.FIM_SEP_ID: None, Key.FIM_PRE_ID: None, Key.FIM_SUF_ID: None,
                   Key.FIM_MID_ID: None}
        pre_name = self._str(md, Key.PRE)
        rule = VOCAB_RULES[self.model]
        special.update(rule.ids)
        add_bos, add_eos, add_sep = rule.add_bos, rule.add_eos, rule.add_sep
        self.add_space_prefix = rule.space_prefix
        spec = None
        self._raw = False                              # plain-text BPE vocabulary (PreSpec.raw)
        if self.model == "gemma4":                     # llama.cpp sets the pre-tokenizer itself
            pre_name = "gemma4"
        if self.model not in ("gpt2", "gemma4"):       # only BPE has pre-tokenizers
            self.pre = "default" if pre_name is None else pre_name
        else:
            if pre_name is None:
                log.warning("%s: no %s; using the 'default' pre-tokenizer (quality may suffer)",
                            name, Key.PRE)
                pre_name = "default"
            spec = PRE_TOKENIZERS.get(pre_name)
            if spec is None:
                if not allow_unknown_pre:
                    _fail(name, f"unknown pre-tokenizer {pre_name!r} ({Key.PRE}); known: "
                                f"{', '.join(sorted(PRE_TOKENIZERS))}")
                log.warning("%s: unknown pre-tokenizer %r, falling back to 'default' as asked; "
                            "token ids may differ from the model's own tokenizer", name, pre_name)
                spec = PRE_TOKENIZERS["default"]
            self.pre = spec.name
            self._raw = spec.raw
            add_bos, add_sep = bool(spec.add_bos), spec.add_sep
            if spec.no_bos:
                special["bos"] = None
        prefix = self._bool(md, Key.ADD_PREFIX)
        if prefix is not None:
            self.add_space_prefix = prefix
        for key, slot in ((Key.BOS_ID, "bos"), (Key.EOS_ID, "eos"), (Key.EOT_ID, "eot"),
                          (Key.EOM_ID, "eom"), (Key.UNK_ID, "unk"), (Key.SEP_ID, "sep"),
                          (Key.PAD_ID, "pad"), (Key.MASK_ID, "mask"), (Key.FIM_PAD_ID, Key.FIM_PAD_ID),
                          (Key.FIM_REP_ID, Key.FIM_REP_ID), (Key.FIM_SEP_ID, Key.FIM_SEP_ID),
                          (Key.FIM_PRE_ID, Key.FIM_PRE_ID), (Key.FIM_SUF_ID, Key.FIM_SUF_ID),
                          (Key.FIM_MID_ID, Key.FIM_MID_ID),
                          # the older keys, read after (and so over) the fim_* ones, as llama.cpp
                          (Key.PREFIX_ID, Key.FIM_PRE_ID), (Key.SUFFIX_ID, Key.FIM_SUF_ID),
                          (Key.MIDDLE_ID, Key.FIM_MID_ID)):
            if special[slot] is not None and special[slot] >= n:
                special[slot] = None                   # a default outside this vocabulary
            v = md.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                _fail(name, f"{key} must be an integer, not {type(v).__name__}")
            if int(v) in (-1, 0xFFFFFFFF):             # how converters write "no token"
                continue
            if not 0 <= int(v) < n:
                log.warning("%s: %s = %d is outside the vocabulary (%d tokens); ignored",
                            name, key, int(v), n)
                continue
            special[slot] = int(v)
        flags = [self._bool(md, key) for key in (Key.ADD_BOS, Key.ADD_EOS, Key.ADD_SEP)]
        self.add_bos, self.add_eos, self.add_sep = (d if v is None else v for v, d in
                                                    zip(flags, (add_bos, add_eos, add_sep)))
        if spec is not None and spec.always_bos:
            self.add_bos = True
        return special, spec

    def _end_of_generation(self, special, attr):
        """End of turn / generation tokens, found by text where the file does not say (as
        llama.cpp does); fills `special`'s eot/eom/FIM slots, marks `attr`; returns the EOG ids."""
        texts = self._text

        def mark_control(i):
            attr[i] |= A_CONTROL

        known = {}                                     # text -> id, for the texts llama.cpp looks for
        for t in self._id.keys() & (_EOG_TEXTS | set(_EOT_TEXTS) | {"<|eom_id|>"}
                                    | {x for names in _FIM_TEXTS.values() for x in names}
                                    | {x for names in _FIM_IO_TEXTS.values() for x in names}):
            known[t] = self._id[t]

        def first(names):                              # lowest id among these texts
            ids = [known[t] for t in names if t in known]
            return min(ids) if ids else None

        if special["eot"] is None:
            for t in _EOT_TEXTS:
                if t in known:
                    special["eot"] = known[t]
                    mark_control(known[t])
                    break
        if special["eom"] is None and "<|eom_id|>" in known:
            special["eom"] = known["<|eom_id|>"]
            mark_control(special["eom"])
        for key, names in (_FIM_IO_TEXTS | _FIM_TEXTS).items():
            if special[key] is None and first(names) is not None:
                special[key] = first(names)
                mark_control(special[key])
        for i in np.nonzero(self._types == TokenType.CONTROL)[0].tolist() + list(known.values()):
            if attr[i] & A_CONTROL and "unused" in texts[i]:
                attr[i] |= A_UNUSED
        eog = {special[k] for k in _FIM_TEXTS if special[k] is not None}
        for t in _EOG_TEXTS:
            if t in known:
                eog.add(known[t])
                mark_control(known[t])
        for t in _ALWAYS_RENDERED:
            if t in self._id:
                attr[self._id[t]] = A_USER_DEFINED
        for slot in ("eos", "eot", "eom"):
            if special[slot] is not None:
                eog.add(special[slot])
        eog_texts = {texts[i] for i in eog}
        if "<|end|>" in eog_texts and (("<|return|>" in eog_texts and ("<|call|>" in eog_texts or
                                                                        "<|calls|>" in eog_texts))
                                       or ({"<|calls|>", "<|call|>"} & eog_texts and "<|flush|>" in eog_texts)):
            end = self._id["<|end|>"]                  # gpt-oss / solar-open: <|end|> is not the end
            eog.discard(end)
            attr[end] = A_USER_DEFINED
        if "</s>" in eog_texts and ({"<|tool_response>", "<|plamo:eos|>"} & eog_texts):
            s = self._id["</s>"]
            eog.discard(s)
            attr[s] = A_NORMAL
        return eog

    def _order_specials(self, md, attr):
        """Special tokens matched in text before tokenizing, longest first -> self._attr,
        _special_all/_special_user and their groups by prefix."""
        texts = self._text
        order = sorted((i for i in range(self.n_vocab) if attr[i] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)),
                       key=lambda i: -len(texts[i].encode("utf-8", "surrogateescape")))
        general_name = md.get(Key.NAME)
        if isinstance(general_name, str) and ("phi-3" in general_name.lower() or "phi3" in general_name.lower()):
            for i in order:                            # Phi-3: spaces after specials are eaten
                attr[i] |= A_RSTRIP
            if "</s>" in self._id:
                attr[self._id["</s>"]] |= A_RSTRIP
            for t in ("<unk>", "<s>", "<|endoftext|>"):
                if t in self._id:
                    attr[self._id[t]] &= ~A_RSTRIP
        self._attr = attr
        self._special_all = [(texts[i], i, attr[i]) for i in order]
        self._special_user = [s for s in self._special_all if not s[2] & (A_CONTROL | A_UNKNOWN)]
        self._groups_all = self._group(self._special_all)
        self._groups_user = self._group(self._special_user)
        self._groups_control = self._group([s for s in self._special_all
                                            if s[2] & (A_CONTROL | A_UNKNOWN)])

    def _build_model(self, md, spec):
        """The segmenter: compiled SentencePiece BPE (llama) or byte-level BPE (gpt2), or
        WordPiece (bert)."""
        texts = self._text
        self._wpm = None
        if self.model == "bert":
            lower = self._bool(md, Key.NORMALIZER_LOWERCASE)
            lower = True if lower is None else lower
            strip = self._bool(md, Key.NORMALIZER_STRIP_ACCENTS)
            self._wpm = WordPiece(self._id, self.unk_id, lower, lower if strip is None else strip)
            self._spm = self._bpe = None
        elif self.model == "llama":
            byte_tokens = []
            for b in range(256):
                t = self._id.get(f"<0x{b:02X}>")
                if t is None:                          # llama.cpp's fallback: the byte itself
                    t = self._id.get(bytes((b,)).decode("utf-8", "surrogateescape"))
                if t is None:                          # none: <unk>, or the byte is dropped
                    t = self.unk_id if self.unk_id is not None else -1
                byte_tokens.append(t)
            self._spm = _bpe.SPMModel(texts, self._scores, byte_tokens)
            # words can be merged one by one when no token joins a character to a following
            # U+2581 (true of SentencePiece vocabularies split on whitespace)
            self._spm_words = not any("\u2581" in t[1:] and re.search("[^\u2581]\u2581", t)
                                      for t in texts)
            self._bpe = None
        else:
            merges = md.get(Key.MERGES)
            if not isinstance(merges, list) or (merges and set(map(type, merges)) != {str}):
                _fail(self.name, f"{Key.MERGES} must be an array of strings for a "
                                 f"{self.model!r} tokenizer")
            self._bpe = _bpe.BPEModel(texts, merges, _bpe.PreTokenizer(spec.ops), spec.ignore_merges,
                                      spec.raw, spec.newline_tokens)
            bad = self._bpe.bad_merge
            if bad >= 0:
                _fail(self.name, f"{Key.MERGES}[{bad}] = {merges[bad][:40]!r} is not two tokens "
                                 "separated by a space")
            self._spm = None

    @staticmethod
    def _group(specials):
        """Special tokens by their first two characters: {prefix: [(rank, text, id, attr)]}."""
        groups = {}
        for rank, (tok, tid, a) in enumerate(specials):
            groups.setdefault(tok[:2], []).append((rank, tok, tid, a))
        return groups

    # --- metadata checks ---------------------------------------------------------------------
    def _str(self, md, key, required=False):
        v = md.get(key)
        if v is None:
            if required:
                _fail(self.name, f"missing {key}")
            return None
        if not isinstance(v, str):
            _fail(self.name, f"{key} must be a string, not {type(v).__name__}")
        return v

    def _bool(self, md, key):
        v = md.get(key)
        if v is None:
            return None
        if not isinstance(v, (bool, np.bool_)):
            _fail(self.name, f"{key} must be a bool, not {type(v).__name__}")
        return bool(v)

    def _array(self, md, key, n, kinds):
        v = md.get(key)
        if v is None:
            return None
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind not in kinds:
            _fail(self.name, f"{key} must be a numeric array ({'/'.join(kinds)}), "
                             f"not {getattr(v, 'dtype', type(v).__name__)}")
        if len(v) != n:
            _fail(self.name, f"{key} has {len(v)} entries but {Key.TOKENS} has {n}")
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            i = int(np.nonzero(~np.isfinite(v))[0][0])
            _fail(self.name, f"{key}[{i}] = {v[i]} is not finite")
        return v

    def _make_piece(self, i):
        """The bytes token i stands for (special tokens as their text)."""
        p = self._pieces[i]
        if p is None:
            p = self._pieces[i] = self._piece_uncached(i)
        return p

    def _piece_uncached(self, i):
        t, a = self._text[i], self._attr[i]
        if a & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            return t.encode("utf-8", "surrogateescape")
        if a & A_NORMAL:
            if self.model in ("llama", "bert") or self._raw:
                return t.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            raw = _bpe.byte_level_decode([t])[0]
            return raw if raw is not None else t.encode("utf-8", "surrogateescape")
        if a & A_BYTE:
            if len(t) != 6 or not t.startswith("<0x") or t[5] != ">" or \
                    any(c not in "0123456789abcdefABCDEF" for c in t[3:5]):
                _fail(self.name, f"{Key.TOKENS}[{i}] = {t!r} has type BYTE but is not <0xHH>")
            return bytes((int(t[3:5], 16),))
        return b""

    # --- encoding ------------------------------------------------------------------------------
    def _partition(self, text, parse_special, marks=()):
        """Split text around special tokens: a list of str (raw text) and int (token ids).
        `marks`: sorted positions of CONTENT_MARKs taken out of the text; a control token
        whose text holds one (s <= mark < end) is not matched there.

        llama.cpp takes the special tokens one at a time, longest first, and cuts every
        occurrence out of the text that is still raw (eating whitespace next to tokens marked
        lstrip/rstrip). The same, over a mask of the text instead of a list of fragments:
        0 raw, 1 taken by a token, 2 whitespace eaten. `_partition_reference` is the direct
        transcription, kept for the tests."""
        specials = self._special_all if parse_special else self._special_user
        if not specials or not text:
            return [text] if text else []
        # only tokens that occur at all: one scan per group of tokens sharing their first two
        # characters, then one per token of a group that occurs
        found = []
        for key, members in (self._groups_all if parse_special else self._groups_user).items():
            if key in text:
                found += [m for m in members if len(m[1]) <= 2 or m[1] in text]
        specials = [m[1:] for m in sorted(found)]
        if not specials:
            return [text]
        n = len(text)
        mask = bytearray(n)
        taken = {}                                     # start -> (token id, length)
        for tok, tid, a in specials:
            k = len(tok)
            block = b"\x01" * k
            pos = text.find(tok)
            marked = marks if a & (A_CONTROL | A_UNKNOWN) else ()
            while pos >= 0:
                if marked and (i := bisect.bisect_left(marked, pos)) < len(marked) and \
                        marked[i] < pos + k:
                    pos = text.find(tok, pos + 1)      # written in a message: plain text
                elif mask.find(0x01, pos, pos + k) < 0 and mask.find(0x02, pos, pos + k) < 0:
                    mask[pos:pos + k] = block
                    taken[pos] = (tid, k)
                    if a & A_LSTRIP:
                        q = pos - 1
                        while q >= 0 and not mask[q] and text[q] in _C_SPACE:
                            mask[q] = 2
                            q -= 1
                    end = pos + k
                    if a & A_RSTRIP:
                        while end < n and not mask[end] and text[end] in _C_SPACE:
                            mask[end] = 2
                            end += 1
                    pos = text.find(tok, end)
                else:
                    pos = text.find(tok, pos + 1)
        out = []
        pos = 0
        while pos < n:
            m = mask[pos]
            if m == 1:
                tid, k = taken[pos]
                out.append(tid)
                pos += k
            elif m == 2:
                pos += 1
            else:
                end = mask.find(0x01, pos)
                end2 = mask.find(0x02, pos)
                end = n if end < 0 else end
                end = end if end2 < 0 else min(end, end2)
                out.append(text[pos:end])
                pos = end
        return out

    def _partition_reference(self, text, parse_special):
        """llama.cpp's special-token partitioning transcribed directly (slow; for tests)."""
        specials = self._special_all if parse_special else self._special_user
        frags = [text] if text else []
        for tok, tid, a in specials:
            out = []
            for frag in frags:
                if type(frag) is int or tok not in frag:
                    out.append(frag)
                    continue
                pos = 0
                while True:
                    m = frag.find(tok, pos)
                    if m < 0:
                        break
                    left = frag[pos:m]
                    if a & A_LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = m + len(tok)
                    if a & A_RSTRIP:
                        while pos < len(frag) and frag[pos] in _C_SPACE:
                            pos += 1
                if pos < len(frag):
                    out.append(frag[pos:])
            frags = out
        return frags

    def encode(self, text, add_special=True, parse_special=False, space_prefix=True,
               marked=False):
        """Token ids of `text`. add_special: BOS/EOS as the model asks (add_bos/add_eos);
        parse_special: control tokens written in the text (e.g. "<|im_start|>") become their
        ids, otherwise they are tokenized as plain text. User-defined tokens always match.
        space_prefix=False: no space before the first text or text after a special token, even
        where the vocabulary adds one (SentencePiece's add_space_prefix): the tokens of a piece
        of text in the middle of a reply, e.g. what a grammar forces.
        marked=True: `text` holds strings passed through defuse() (a rendered chat prompt):
        the CONTENT_MARKs are dropped and the control-token text they sit in stays plain text."""
        if not isinstance(text, str):
            raise TypeError(f"encode() needs a str, not {type(text).__name__}")
        out = list(self._first) if add_special else []
        marks = ()
        if marked and CONTENT_MARK in text:
            parts = text.split(CONTENT_MARK)
            marks = list(itertools.accumulate(len(x) for x in parts[:-1]))
            text = "".join(parts)
        frags = self._partition(text, parse_special, marks)
        if self._wpm is not None:
            for frag in frags:
                out += [frag] if type(frag) is int else self._wpm.encode(frag)
        elif self._spm is not None:
            prev_special = True                        # a space before the first text, and after specials
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special and space_prefix:
                    frag = " " + frag
                out += self._spm.encode(frag.replace(" ", "\u2581").encode("utf-8", "surrogatepass"),
                                        self._spm_words)
                prev_special = False
        else:
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                else:
                    out += self._bpe.encode(frag.replace(" ", "\u2581") if self._raw else frag)
        if add_special:
            out += self._last
        return out

    def encode_pair(self, first, second, parse_special=False):
        """A pair of texts as one sequence, the way llama.cpp lays out a reranker's query and
        document (VOCAB_RULES): for a BERT vocabulary as the converter writes it,
        [CLS] first [SEP] second [SEP]. Returns (ids, token_types): the segment of each token,
        0 up to the first text's closing token, 1 after it (BERT's token type ids; llama.cpp's
        BERT graph adds type 0's row to every token, and so does the encoder unless given
        these)."""
        end = self.eos_id if self.eos_id is not None else self.sep_id
        for flag, tid, key in ((self.add_bos, self.bos_id, Key.BOS_ID), (self.add_eos, end, Key.EOS_ID),
                               (self.add_sep, self.sep_id, Key.SEP_ID)):
            if flag and tid is None:
                raise TokenizerError(f"{self.name}: a pair needs {key}, which the vocabulary lacks")
        a = ([self.bos_id] if self.add_bos else []) + self.encode(first, False, parse_special) \
            + ([end] if self.add_eos else [])
        b = ([self.sep_id] if self.add_sep else []) + self.encode(second, False, parse_special) \
            + ([end] if self.add_eos else [])
        return a + b, [0] * len(a) + [1] * len(b)

    def defuse(self, text):
        """`text` (a string from a chat message) with a CONTENT_MARK before the last character of
        every control token's text in it, so that encode(..., marked=True) of a prompt built
        from it tokenizes that text as plain text, not as the control token. Marks already in
        `text` are dropped first: a client cannot place one."""
        text = text.replace(CONTENT_MARK, "")
        at = set()
        for key, members in self._groups_control.items():
            if key in text:
                for _, tok, _, _ in members:
                    pos = text.find(tok)
                    while pos >= 0:
                        at.add(pos + len(tok) - 1)
                        pos = text.find(tok, pos + 1)
        for p in sorted(at, reverse=True):
            text = text[:p] + CONTENT_MARK + text[p:]
        return text

    # --- decoding ------------------------------------------------------------------------------
    def _check_id(self, i):
        if not 0 <= i < self.n_vocab:
            raise TokenizerError(f"token id {i} is outside the vocabulary (0..{self.n_vocab - 1})")

    def token_piece(self, i):
        """The bytes of token i (control tokens as their text, e.g. b"<|im_end|>")."""
        self._check_id(i)
        return self._make_piece(i)

    def token_text(self, i):
        """Token i as written in the vocabulary (e.g. "\u2581Hello", "\u0120world", "<0x0A>")."""
        self._check_id(i)
        return self._text[i]

    def token_type(self, i):
        self._check_id(i)
        return TokenType(int(self._types[i]))

    def is_control(self, i):
        """Control and unknown tokens: not rendered as text unless asked (decode(special=True))."""
        self._check_id(i)
        return bool(self._attr[i] & (A_CONTROL | A_UNKNOWN))

    def is_eog(self, i):
        return i in self.eog_ids

    def _piece_for_text(self, i, special):
        self._check_id(i)
        if not special and self._attr[i] & (A_CONTROL | A_UNKNOWN):
            return b""
        return self._make_piece(i)

    def decode_bytes(self, ids, special=False):
        """The bytes of `ids` concatenated; SPM's added leading space is removed at the start."""
        out = []
        strip = self.add_space_prefix or self._wpm is not None   # WordPiece: word-start U+2581
        for i in ids:
            p = self._piece_for_text(int(i), special)
            if strip and p:
                if p[:1] == b" ":
                    p = p[1:]
                strip = False
            out.append(p)
        return b"".join(out)

    def decode(self, ids, special=False):
        """Text of `ids`. Control tokens are left out unless `special`; invalid UTF-8 (a
        sequence cut in the middle) becomes U+FFFD. Spaces are kept exactly as the tokens
        carry them (no clean-up of " ," and the like, so decode(encode(t)) == t)."""
        return self.decode_bytes(ids, special).decode("utf-8", "replace")

    def stream_decoder(self, special=False, strip_leading_space=False):
        """A decoder for tokens arriving one at a time: push(id) returns only complete UTF-8
        characters, holding back a character split across tokens until it is whole."""
        return StreamDecoder(self, special, strip_leading_space)

    def __repr__(self):
        return (f"Tokenizer({self.name!r}, model={self.model!r}, pre={self.pre!r}, "
                f"n_vocab={self.n_vocab})")


class StreamDecoder:
    def __init__(self, tok, special=False, strip_leading_space=False):
        self._tok = tok
        self._special = special
        self._strip = strip_leading_space
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id):
        """Text that token_id completes ("" while a character is still incomplete)."""
        p = self._tok._piece_for_text(int(token_id), self._special)
        if self._strip and p:
            if p[:1] == b" ":
                p = p[1:]
            self._strip = False
        return self._dec.decode(p)

    def flush(self):
        """Whatever is left (an incomplete character comes out as U+FFFD)."""
        return self._dec.decode(b"", final=True)
