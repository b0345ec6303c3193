"""Tokenizer behaviour a user notices: special tokens, BOS/EOS, end-of-generation ids, streaming
of split characters, pieces, and refusal of bad metadata (it is untrusted input)."""
import functools
import logging

import numpy as np
import pytest

from bpe_vocab import bpe_metadata
from conftest import testdata
from edged import Tokenizer
from edged.errors import TokenizerError
from edged.format.gguf import Key
from edged.text.tokenizer import PRE_TOKENIZERS, TokenType


@functools.lru_cache(maxsize=None)
def vocab(name):
    return Tokenizer.from_gguf(testdata("vocab", f"ggml-vocab-{name}.gguf"))


# --- synthetic vocabularies ---------------------------------------------------------------------
def spm_metadata(**keys):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
             ["\u2581", "h", "i", "hi", "\u2581hi", "\u2581h"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256 + \
            [TokenType.NORMAL] * 6
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -1.5, -0.5, -3.0]
    md = {Key.TOKENIZER_MODEL: "llama", Key.TOKENS: tokens, Key.TOKEN_TYPE: np.array(types, np.int32),
          Key.SCORES: np.array(scores, np.float32)}
    md.update(keys)
    return md


# --- BPE merges and SPM scores ------------------------------------------------------------------
def test_bpe_applies_merges_by_rank():
    md = bpe_metadata(merges=[("l", "l"), ("h", "e"), ("he", "ll"), ("hell", "o")])
    tok = Tokenizer(md)
    ids = tok.encode("hello", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["hello"]
    # without the last merge the word stays in its ranked pieces
    tok2 = Tokenizer(bpe_metadata(merges=[("l", "l"), ("h", "e"), ("he", "ll")]))
    assert [tok2.token_text(i) for i in tok2.encode("hello", add_special=False)] == ["hell", "o"]
    # lower rank first: "e l" before "h e" splits differently
    tok3 = Tokenizer(bpe_metadata(merges=[("e", "l"), ("h", "e"), ("el", "l")]))
    assert [tok3.token_text(i) for i in tok3.encode("hell", add_special=False)] == ["h", "ell"]


def test_spm_merges_by_score_with_space_prefix_and_byte_fallback():
    tok = Tokenizer(spm_metadata())
    ids = tok.encode("hi", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["\u2581hi"]           # the added leading space
    assert tok.encode("hi") == [1] + ids                               # add_bos defaults to true
    # "é" is not in the vocabulary: its two UTF-8 bytes as byte tokens
    ids = tok.encode("\u00e9", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["\u2581", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "\u00e9"
    no_prefix = Tokenizer(spm_metadata(**{Key.ADD_PREFIX: False}))
    assert [no_prefix.token_text(i) for i in no_prefix.encode("hi", add_special=False)] == ["hi"]


# --- special tokens -----------------------------------------------------------------------------
def test_parse_special_turns_control_text_into_one_id():
    tok = vocab("llama-bpe")
    text = "<|start_header_id|>user<|end_header_id|>"
    parsed = tok.encode(text, add_special=False, parse_special=True)
    assert parsed[0] == 128006 and parsed[-1] == 128007 and len(parsed) == 3
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert 128006 not in plain and len(plain) > 3
    assert tok.decode(plain) == text                                   # still the same text


def test_user_defined_tokens_match_without_parse_special():
    tok = vocab("qwen2")
    assert tok.token_type(151650) == TokenType.USER_DEFINED
    ids = tok.encode("a[PAD151650]b", add_special=False, parse_special=False)
    assert 151650 in ids
    # control tokens only with parse_special
    assert 151644 not in tok.encode("<|im_start|>", add_special=False)
    assert tok.encode("<|im_start|>", add_special=False, parse_special=True) == [151644]


def test_longest_special_token_wins():
    md = bpe_metadata(extra=[("<a>", TokenType.CONTROL), ("<a><b>", TokenType.CONTROL),
                             ("<b>", TokenType.CONTROL)])
    tok = Tokenizer(md)
    ids = tok.encode("<a><b><b>", add_special=False, parse_special=True)
    assert [tok.token_text(i) for i in ids] == ["<a><b>", "<b>"]


def test_phi3_special_tokens_eat_following_spaces():
    tok = vocab("phi-3")
    ids = tok.encode("<|user|>  Hi", add_special=False, parse_special=True)
    assert ids[0] == tok._id["<|user|>"]
    assert tok.decode(ids[1:]) == "Hi"                                 # the spaces went with the token


def test_bos_eos_follow_the_model():
    assert vocab("llama-spm").encode("x")[0] == 1
    assert vocab("llama-bpe").encode("x")[0] == 128000                 # llama-bpe adds BOS by default
    assert 50256 not in vocab("gpt-2").encode("x")                     # gpt-2 adds nothing
    assert vocab("deepseek-llm").encode("x")[0] == 100000              # add_bos_token = true
    assert vocab("llama-spm").encode("x", add_special=False)[0] != 1
    tok = Tokenizer(spm_metadata(**{Key.ADD_EOS: True, Key.ADD_BOS: False}))
    assert tok.encode("hi")[-1] == 2 and tok.encode("hi")[0] != 1


def test_end_of_generation_ids():
    bpe = vocab("llama-bpe")
    assert {128001, 128009} <= bpe.eog_ids                             # <|end_of_text|>, <|eot_id|>
    assert bpe.eot_id == 128009 and bpe.eos_id == 128001
    qwen = vocab("qwen2")
    assert {151643, 151645} <= qwen.eog_ids                            # <|endoftext|>, <|im_end|>
    phi = vocab("phi-3")
    assert phi._id["<|end|>"] in phi.eog_ids and phi.eos_id in phi.eog_ids
    assert vocab("llama-spm").eog_ids == frozenset({2})
    md = bpe_metadata(extra=[("<end_of_turn>", TokenType.NORMAL), ("<|return|>", TokenType.CONTROL),
                             ("<|call|>", TokenType.CONTROL), ("<|end|>", TokenType.CONTROL)])
    tok = Tokenizer(md)
    texts = {tok.token_text(i) for i in tok.eog_ids}
    assert "<end_of_turn>" in texts and tok.is_control(tok._id["<end_of_turn>"])
    assert "<|end|>" not in texts                                      # gpt-oss: <|end|> is not the end


# --- decoding -----------------------------------------------------------------------------------
def test_pieces_and_control_tokens_in_decode():
    tok = vocab("gpt-2")
    i = tok._id["\u0120world"]
    assert tok.token_piece(i) == b" world"
    bpe = vocab("llama-bpe")
    ids = bpe.encode("hi")
    assert bpe.decode(ids) == "hi"
    assert bpe.decode(ids, special=True) == "<|begin_of_text|>hi"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bpe.decode([bpe.n_vocab])


def test_stream_decoder_holds_a_split_character_until_complete():
    tok = vocab("llama-spm")
    ids = tok.encode("\U0001F999!", add_special=False)                 # not in the vocab: 4 byte tokens
    byte_ids = [i for i in ids if tok.token_type(i) == TokenType.BYTE]
    assert len(byte_ids) == 4
    dec = tok.stream_decoder()
    out = [dec.push(i) for i in ids]
    assert [o for o in out if o] == [" ", "\U0001F999", "!"] or "".join(out) == " \U0001F999!"
    assert out.count("\U0001F999") == 1 and all("\ufffd" not in o for o in out)
    # a cut character comes out as U+FFFD only at flush
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in byte_ids[:2]] == ["", ""]
    assert dec.flush() == "\ufffd"


# --- pre-tokenizer selection ----------------------------------------------------------------------
def test_unknown_pre_tokenizer_is_refused_by_name(caplog):
    md = bpe_metadata(pre="no-such-pre")
    with pytest.raises(TokenizerError, match="'no-such-pre'"):
        Tokenizer(md)
    with caplog.at_level(logging.WARNING, logger="edged.text.tokenizer"):
        tok = Tokenizer(md, allow_unknown_pre=True)
    assert tok.pre == "default" and "no-such-pre" in caplog.text


def test_required_pre_tokenizers_are_known():
    for name in ("default", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm", "deepseek-coder", "falcon",
                 "starcoder", "refact", "mpt", "command-r", "qwen35", "smollm"):
        tok = Tokenizer(bpe_metadata(merges=[("a", "b")], pre=name))
        assert tok.decode(tok.encode("ab 12 x", add_special=False)) == "ab 12 x"


# --- untrusted metadata --------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda md: md.update({Key.TOKENIZER_MODEL: "bert"}), "'bert'"),
    (lambda md: md.pop(Key.TOKENS), "tokenizer.ggml.tokens"),
    (lambda md: md.update({Key.TOKENS: [1, 2]}), "array of strings"),
    (lambda md: md.update({Key.SCORES: np.zeros(3, np.float32)}), "has 3 entries"),
    (lambda md: md.update({Key.SCORES: np.full(len(md[Key.TOKENS]), np.nan, np.float32)}), "not finite"),
    (lambda md: md.update({Key.TOKEN_TYPE: np.zeros(len(md[Key.TOKENS]), np.float32)}), "numeric array"),
    (lambda md: md[Key.TOKEN_TYPE].__setitem__(5, 9), r"token_type\[5\] = 9"),
    (lambda md: md[Key.TOKENS].__setitem__(3, "<0x-1>"), "not <0xHH>"),
    (lambda md: md[Key.TOKENS].__setitem__(4, "<0x00>"), "duplicates"),
    (lambda md: md.update({Key.BOS_ID: "1"}), "must be an integer"),
    (lambda md: md.update({Key.ADD_BOS: 1}), "must be a bool"),
])
def test_bad_metadata_is_refused(change, message):
    md = spm_metadata()
    md[Key.TOKENS] = list(md[Key.TOKENS])
    md[Key.TOKEN_TYPE] = md[Key.TOKEN_TYPE].copy()
    change(md)
    with pytest.raises(TokenizerError, match=message):
        Tokenizer(md)


def test_add_bos_without_a_bos_token_is_refused():
    md = bpe_metadata(pre="chatglm-bpe", **{Key.ADD_BOS: True})    # chatglm-bpe has no BOS
    with pytest.raises(TokenizerError, match="no BOS"):
        Tokenizer(md)


def test_bad_merges_are_refused():
    md = bpe_metadata(merges=[("a", "b")])
    md[Key.MERGES] = md[Key.MERGES] + ["nospace"]
    with pytest.raises(TokenizerError, match=r"merges\[1\] = 'nospace'"):
        Tokenizer(md)
    md.pop(Key.MERGES)
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer(md)


def test_out_of_range_special_id_is_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="edged.text.tokenizer"):
        tok = Tokenizer(spm_metadata(**{Key.PAD_ID: 99999}))
    assert tok.pad_id is None and "99999" in caplog.text


def test_pre_tokenizer_table_names_every_required_value():
    assert PRE_TOKENIZERS["llama-bpe"].ignore_merges and PRE_TOKENIZERS["llama-bpe"].add_bos


def test_stories260k_prompt_matches_llama_cpp_golden():
    np_ = pytest.importorskip("numpy")
    golden = np_.load(testdata("golden", "stories260K.golden.npz"))
    tok = Tokenizer.from_gguf(testdata("models", "stories260K.gguf"))
    prompt = golden["tokens"][: int(golden["n_prompt"])].tolist()
    assert tok.encode("Once upon a time") == prompt
    assert tok.decode(prompt) == "Once upon a time"


@pytest.mark.parametrize("extra, words", [
    ((), True),                          # SentencePiece-like: U+2581 only at the start of tokens
    (("\u2581\u2581x",), True),          # a run of U+2581 is still a word start
    (("i\u2581h",), False),              # a token joins a character to a following U+2581
    (("\0\u2581",), False),              # ... NUL being the character
    (("a\0b", "\u2581a"), True),         # a NUL inside a token, none before U+2581
    (("a\0", "\u2581b"), True),          # a token ending in NUL, the next one starting with U+2581
])
def test_spm_merges_word_by_word_only_when_no_token_spans_a_word_start(extra, words):
    md = spm_metadata()
    n = len(extra)
    md[Key.TOKENS] = md[Key.TOKENS] + list(extra)
    md[Key.TOKEN_TYPE] = np.concatenate([md[Key.TOKEN_TYPE], np.full(n, int(TokenType.NORMAL), np.int32)])
    md[Key.SCORES] = np.concatenate([md[Key.SCORES], np.full(n, -4.0, np.float32)])
    tok = Tokenizer(md)
    assert tok._spm_words is words
