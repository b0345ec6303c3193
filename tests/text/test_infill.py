"""Fill-in-the-middle prompts against llama.cpp's own construction (llama-server's
format_prompt_infill and llama_vocab's FIM token discovery, 0.3.36), one small synthetic
vocabulary per family: Qwen2.5-Coder (<|fim_prefix|>, repo and file separators), StarCoder2
(<fim_prefix>, no separators: the snippet marker), CodeLlama (SentencePiece, ▁<PRE>, BOS),
DeepSeek-Coder (<｜fim▁begin｜>), ids from tokenizer.ggml.fim_*_token_id and from the older
prefix/suffix/middle keys, and a vocabulary without FIM tokens. Then the same families on real
vocabularies (tests/support/fim_vocabs.py) against what llama.cpp itself found and tokenized
(tests/data/goldens/infill.json, tools/make_infill_goldens.py), Codestral among them."""
import numpy as np
import pytest

from bpe_vocab import bpe_metadata
from conftest import testdata
import fim_vocabs
from edged.errors import RequestError
from edged.format.gguf import Key
from edged.text import infill
from edged.text.infill import Infill
from edged.text.tokenizer import Tokenizer, TokenType

C = TokenType.CONTROL


def bpe(extra, **keys):
    return Tokenizer(bpe_metadata(extra=[(t, C) for t in extra], **keys))


def spm(extra):
    """A SentencePiece vocabulary (CodeLlama's kind): <unk> <s> </s>, byte tokens, extra."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(extra)
    types = [2, 3, 3] + [6] * 256 + [C] * len(extra)
    md = {Key.TOKENIZER_MODEL: "llama", Key.TOKENS: toks,
          Key.TOKEN_TYPE: np.array(types, np.int32), Key.SCORES: np.zeros(len(toks), np.float32)}
    return Tokenizer(md)


QWEN = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
        "<|repo_name|>", "<|file_sep|>"]
STARCODER2 = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
              "<repo_name>", "<file_sep>"]
DEEPSEEK = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
            "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581end\uff5c>"]
CODELLAMA = ["\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"]

BODY = Infill(prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
              extra=(("util.py", "X = 1\n"), (None, "Y = 2\n")), prompt="re")


def ids(tok, text, special=False):
    return tok.encode(text, add_special=False, parse_special=special)


def test_qwen25_coder_repo_level_layout():
    tok = bpe(QWEN)
    i = tok._id
    assert tok.fim == {"pre": i["<|fim_prefix|>"], "suf": i["<|fim_suffix|>"], "mid": i["<|fim_middle|>"],
                       "pad": i["<|fim_pad|>"], "rep": i["<|repo_name|>"], "sep": i["<|file_sep|>"]}
    got = infill.prompt_ids(tok, BODY, n_ctx=4096)
    want = ([i["<|repo_name|>"]] + ids(tok, "myproject\n")
            + [i["<|file_sep|>"]] + ids(tok, "util.py\n") + ids(tok, "X = 1\n")
            + [i["<|file_sep|>"]] + ids(tok, "tmp\n") + ids(tok, "Y = 2\n")
            + [i["<|file_sep|>"]] + ids(tok, "filename\n")
            + [i["<|fim_prefix|>"]] + ids(tok, BODY.prefix) + ids(tok, "re", True)
            + [i["<|fim_suffix|>"]] + ids(tok, BODY.suffix) + [i["<|fim_middle|>"]])
    assert got == want
    # spm_infill: the suffix part first
    spmi = infill.prompt_ids(tok, BODY, n_ctx=4096, spm_infill=True)
    k = spmi.index(i["<|fim_suffix|>"])
    assert spmi[:k] == want[:want.index(i["<|fim_prefix|>"])]
    assert spmi[-1] == i["<|fim_middle|>"]


def test_starcoder2_snippets_without_separators():
    """<repo_name> and <file_sep> are not texts llama.cpp looks for: the extra chunks follow the
    snippet marker, and no repo header or closing file separator is written."""
    tok = bpe(STARCODER2)
    i = tok._id
    assert tok.fim["rep"] is None and tok.fim["sep"] is None and tok.fim["pad"] == i["<fim_pad>"]
    got = infill.prompt_ids(tok, BODY, n_ctx=4096)
    snip = ids(tok, infill.SNIPPET)
    want = (snip + ids(tok, "X = 1\n") + snip + ids(tok, "Y = 2\n")
            + [i["<fim_prefix>"]] + ids(tok, BODY.prefix) + ids(tok, "re")
            + [i["<fim_suffix>"]] + ids(tok, BODY.suffix) + [i["<fim_middle>"]])
    assert got == want


def test_codellama_bos_after_extra_and_space_prefix():
    tok = spm(CODELLAMA)
    i = tok._id
    assert (tok.fim["pre"], tok.fim["suf"], tok.fim["mid"]) == (i["\u2581<PRE>"], i["\u2581<SUF>"], i["\u2581<MID>"])
    got = infill.prompt_ids(tok, Infill(prefix="a", suffix="b", extra=(("f", "c"),)), n_ctx=4096)
    want = (ids(tok, infill.SNIPPET) + ids(tok, "c") + [tok.bos_id, i["\u2581<PRE>"]] + ids(tok, "a")
            + [i["\u2581<SUF>"]] + ids(tok, "b") + [i["\u2581<MID>"]])
    assert got == want
    assert tok.add_bos and got.index(tok.bos_id) > 0     # llama-server puts the extra first


def test_deepseek_coder_by_text():
    tok = bpe(DEEPSEEK)
    i = tok._id
    got = infill.prompt_ids(tok, Infill(prefix="x", suffix="y"), n_ctx=4096)
    assert got == ([i["<\uff5cfim\u2581begin\uff5c>"]] + ids(tok, "x") + [i["<\uff5cfim\u2581hole\uff5c>"]]
                   + ids(tok, "y") + [i["<\uff5cfim\u2581end\uff5c>"]])


def test_ids_from_metadata_and_the_older_keys_win():
    names = ["<a>", "<b>", "<c>", "<d>", "<e>", "<f>"]
    tok = bpe(names, **{Key.FIM_PRE_ID: 256, Key.FIM_SUF_ID: 257, Key.FIM_MID_ID: 258})
    assert (tok.fim["pre"], tok.fim["suf"], tok.fim["mid"]) == (256, 257, 258)
    tok = bpe(names, **{Key.FIM_PRE_ID: 256, Key.PREFIX_ID: 259, Key.SUFFIX_ID: 260,
                        Key.MIDDLE_ID: 261})
    assert (tok.fim["pre"], tok.fim["suf"], tok.fim["mid"]) == (259, 260, 261)
    # FIM_PRE/SUF/MID do not end a generation; PAD/REP/SEP do (llama.cpp's EOG set)
    tok = bpe(QWEN)
    assert tok.fim["pre"] not in tok.eog_ids and tok.fim["pad"] in tok.eog_ids


def test_truncation_as_llama_server():
    tok = bpe(QWEN)
    i = tok._id
    body = Infill(prefix="ab" * 40, suffix="cd" * 40, extra=(("f", "ef" * 40),), prompt="g")
    got = infill.prompt_ids(tok, body, n_ctx=64, n_batch=32, n_predict=8)
    pre, suf, mid = (i[t] for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    a, b = got.index(pre), got.index(suf)
    assert a == 64 - 32 - 16                     # the extra context's last n_ctx - n_batch - 2 n_predict
    assert got[a + 1:b] == ids(tok, body.prefix)[-24:] + ids(tok, "g")   # 3/4 of n_batch
    assert got[b + 1:-1] == ids(tok, body.suffix)[:32 // 4 - 3]          # n_batch/4 - 2 - len(prompt)
    assert got[-1] == mid


def test_mixed_fragments_and_missing_tokens():
    tok = bpe(QWEN)
    got = infill.prompt_ids(tok, Infill(prefix=("a", 65, "b"), suffix=""), n_ctx=4096)
    assert got[got.index(tok.fim["pre"]) + 1:-2] == ids(tok, "a") + [65] + ids(tok, "b")
    with pytest.raises(RequestError, match="out of range"):
        infill.prompt_ids(tok, Infill(prefix=(10 ** 6,)), n_ctx=4096)
    plain = bpe(["<|endoftext|>", "<fim_prefix>"])
    with pytest.raises(RequestError, match="no suffix token, middle token"):
        infill.prompt_ids(plain, Infill(prefix="a", suffix="b"), n_ctx=4096)


@pytest.fixture(scope="module")
def fim_golden():
    return fim_vocabs.goldens()


@pytest.mark.parametrize("name", fim_vocabs.NAMES)
def test_families_on_real_vocabularies_as_llama_cpp(fim_golden, name):
    """llama.cpp's FIM tokens, end-of-generation set, BOS and ids of each part, then the prompt
    llama-server's format_prompt_infill lays out from them: repo header, the extra files,
    [BOS], [PRE] prefix prompt, [SUF] suffix, [MID]."""
    testdata(fim_vocabs.FAMILIES[name][0])
    g, b = fim_golden[name], fim_vocabs.BODY
    tok = fim_vocabs.tokenizer(name)
    assert tok.fim == g["fim"]
    assert sorted(tok.eog_ids) == g["eog"]
    assert (tok.bos_id if tok.add_bos else None) == g["bos"]
    for text, want in g["ids"].items():
        assert ids(tok, text) == want, text
    body = Infill(prefix=b["input_prefix"], suffix=b["input_suffix"], prompt=b["prompt"],
                  extra=tuple((c.get("filename"), c["text"]) for c in b["input_extra"]))
    if g["fim"]["pre"] is None:             # llama-server: "Infill is not supported by this model"
        with pytest.raises(RequestError, match="prefix token, suffix token, middle token"):
            infill.prompt_ids(tok, body, n_ctx=4096)
        return
    t, fim = g["ids"], g["fim"]
    extra = [fim["rep"]] + t["myproject\n"] if fim["rep"] is not None else []
    for c in b["input_extra"]:
        extra += ([fim["sep"]] + t[c.get("filename", "tmp") + "\n"] if fim["sep"] is not None
                  else t[infill.SNIPPET]) + t[c["text"]]
    extra += [fim["sep"]] + t["filename\n"] if fim["sep"] is not None else []
    bos = [g["bos"]] if g["bos"] is not None else []
    pre = [fim["pre"]] + t[b["input_prefix"]] + t[b["prompt"]]
    suf = [fim["suf"]] + t[b["input_suffix"]]
    assert infill.prompt_ids(tok, body, n_ctx=4096) == extra + bos + pre + suf + [fim["mid"]]
    # llama-server's --spm-infill (Codestral's order): the suffix part first
    assert infill.prompt_ids(tok, body, n_ctx=4096, spm_infill=True) == extra + bos + suf + pre + [fim["mid"]]
