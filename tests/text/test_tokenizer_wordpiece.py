"""WordPiece (`tokenizer.ggml.model = bert`): special tokens, normalisation settings from the
GGUF, unknown words, and random text against Hugging Face's BertWordPiece tokenizer built from
the same vocabulary (the `tokenizers` package, a test dependency)."""
import os
import random

import pytest

from edged import Tokenizer
from edged.format.gguf import GGUFFile, Key
from edged.errors import TokenizerError

HERE = os.path.dirname(os.path.abspath(__file__))
BERT_BGE = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-bert-bge.gguf")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(BERT_BGE)


@pytest.fixture(scope="module")
def metadata():
    with GGUFFile.open(BERT_BGE) as f:
        return dict(f.metadata)


def test_cls_and_sep_around_the_text(tok):
    ids = tok.encode("Hello world!")
    assert ids[0] == 101 and ids[-1] == 102       # [CLS] ... [SEP]
    assert tok.token_text(ids[1]) == "\u2581hello"
    assert tok.encode("Hello world!", add_special=False) == ids[1:-1]
    assert tok.decode(ids) == "hello world!".replace("!", " !")
    assert tok.decode(ids, special=True).startswith("[CLS]")


def test_continuation_pieces_and_unknown_words(tok):
    ids = tok.encode("tokenization", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["\u2581token", "ization"]
    # a character no piece covers makes the whole word [UNK], not only that character
    assert tok.encode("ab\u16a0cd", add_special=False) == [tok.unk_id]


def test_special_tokens_in_the_text(tok):
    assert tok.encode("[SEP] x", add_special=False, parse_special=True)[0] == 102
    assert tok.encode("[SEP]", add_special=False, parse_special=False)[0] != 102


def test_normaliser_settings_come_from_the_gguf(metadata):
    cased = Tokenizer(dict(metadata, **{Key.NORMALIZER_LOWERCASE: False}))
    lower = Tokenizer(metadata)
    assert lower.encode("Hello", add_special=False) == lower.encode("hello", add_special=False)
    assert cased.encode("Hello", add_special=False) != lower.encode("hello", add_special=False)
    # accents: dropped with lowercasing by default, kept when strip_accents is false
    keep = Tokenizer(dict(metadata, **{Key.NORMALIZER_STRIP_ACCENTS: False}))
    assert lower.encode("caf\u00e9", add_special=False) == lower.encode("cafe", add_special=False)
    assert keep.encode("caf\u00e9", add_special=False) != lower.encode("cafe", add_special=False)


def test_a_bert_vocabulary_without_separator_is_refused(metadata):
    md = {k: v for k, v in metadata.items() if k != Key.SEP_ID}
    md[Key.TOKENS] = md[Key.TOKENS][:102]          # [UNK] 100 and [CLS] 101, no [SEP] 102
    md[Key.TOKEN_TYPE] = md[Key.TOKEN_TYPE][:102]
    with pytest.raises(TokenizerError, match="separator"):
        Tokenizer(md)


def _hf_tokenizer(metadata):
    tokenizers = pytest.importorskip("tokenizers", reason="test dependency `tokenizers` missing")
    vocab = {}
    for i, (t, ty) in enumerate(zip(metadata[Key.TOKENS], metadata[Key.TOKEN_TYPE])):
        # the GGUF converter wrote "\u2581word" for word starts and "piece" for "##piece"
        text = t[1:] if t.startswith("\u2581") else t if int(ty) != 1 or t.startswith("[") \
            else "##" + t
        vocab.setdefault(text, i)
    return tokenizers.BertWordPieceTokenizer(vocab, lowercase=True, clean_text=True,
                                             handle_chinese_chars=True)


ALPHABET = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3
            + " " * 40 + "\t\n.,;:!?'\"()[]{}-_/\\@#$%^&*+=<>~`|"
            + "\u00e9\u00e8\u00fc\u00f1\u00c5\u00df\u00e7\u0141\u4e2d\u6587\u5b57\u3002"
            + "\u00bf\u00a1\u2014\u201c\u201d\u00e6\u0153\u00f8\u03b1\u03b2\u0436")


def test_random_text_matches_hugging_face_bert_wordpiece(tok, metadata):
    hf = _hf_tokenizer(metadata)
    rng = random.Random(1234)
    bad = []
    for _ in range(600):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60)))
        want = hf.encode(text, add_special_tokens=True).ids
        got = tok.encode(text)
        if got != want:
            bad.append((text, got, want))
    assert not bad, f"{len(bad)} of 600 differ, first: {bad[0]!r}"
