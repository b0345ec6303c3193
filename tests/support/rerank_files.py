"""Rerankers of real shapes, written by the PyPI `gguf` writer (tests/support/gguf_clone.py):
an encoder or decoder file with a seeded random classification head added and its pooling type
set to rank (4), as llama.cpp's converter writes BERT cross-encoders and Qwen3-Reranker.
tools/make_rerank_goldens.py records llama.cpp's scores for the same files; the tests rebuild
them from the same recipe (nothing large is committed)."""
import json
import os

import gguf
import numpy as np

from gguf_clone import clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "..", "shared", "testdata", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "rerank.json")

# Qwen3-Reranker's rerank template as the converter writes it (conversion/qwen.py)
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")

# stories260K tokens -> ChatML control tokens in the Qwen3-Reranker file
CHATML = {"\u2122": "<|im_start|>", "~": "<|im_end|>", "\u200a": "<|endoftext|>"}

QUERY = "what is a cat?"
DOCUMENTS = ["a cat is a small domesticated animal", "the stock market fell today",
             "cats purr and hunt mice", "a", "Paris est la capitale de la France."]

U32, STR, ARR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
BOOL = gguf.GGUFValueType.BOOL


def _n_embd(src):
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    return arch, int(r.fields[f"{arch}.embedding_length"].contents())


def bert_reranker(src, dst, seed=0, dense=True, n_out=1, converter_flags=False):
    """`src` (a bert file) with a head: cls.weight/bias (dense) and cls.output.weight/bias;
    converter_flags: write the special-token flags as today's converter does (add_eos with
    [SEP] as EOS, no add_sep), for a file that has none."""
    arch, E = _n_embd(src)
    rng = np.random.default_rng(seed)
    add = {}
    if dense:
        add["cls.weight"] = (rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32)
        add["cls.bias"] = (rng.standard_normal(E) * 0.1).astype(np.float32)
    add["cls.output.weight"] = (rng.standard_normal((n_out, E)) * 2 / np.sqrt(E)).astype(np.float32)
    add["cls.output.bias"] = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
    meta = {"{arch}.pooling_type": (4, U32)}
    if n_out > 1:
        meta["{arch}.classifier.output_labels"] = ([f"L{i}" for i in range(n_out)], ARR, STR)
    if converter_flags:
        sep = int(gguf.GGUFReader(src).fields["tokenizer.ggml.seperator_token_id"].contents())
        meta.update({"tokenizer.ggml.eos_token_id": (sep, U32),
                     "tokenizer.ggml.add_bos_token": (True, BOOL),
                     "tokenizer.ggml.add_eos_token": (True, BOOL),
                     "tokenizer.ggml.add_sep_token": (False, BOOL)})
    return clone(src, dst, add=add, meta=meta, drop_meta=(f"{arch}.pooling_type",))


def qwen3_reranker(src, dst, yes="\u2581y", no="\u2581n"):
    """A qwen3 decoder (tied embeddings) as a Qwen3-Reranker: cls.output = the token_embd rows
    of "yes" and "no", labels ["yes", "no"], the rerank template, and ChatML's control tokens
    (in the places of three tokens no text here uses) so that the template's <|im_start|> and
    <|im_end|> are single tokens, as in the real vocabulary."""
    r = gguf.GGUFReader(src)
    toks = list(r.fields["tokenizer.ggml.tokens"].contents())
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    for old, new in CHATML.items():
        i = toks.index(old)
        toks[i], types[i] = new, 3          # control
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    rows = np.array(emb.data, np.float32).reshape(len(toks), -1)
    head = np.stack([rows[toks.index(yes)], rows[toks.index(no)]])
    meta = {"{arch}.pooling_type": (4, U32),
            "{arch}.classifier.output_labels": (["yes", "no"], ARR, STR),
            "tokenizer.chat_template.rerank": (QWEN3_RERANK_TEMPLATE, STR),
            "tokenizer.ggml.add_bos_token": (False, BOOL),   # Qwen3's BPE adds none
            "tokenizer.ggml.tokens": (toks, ARR, STR),
            "tokenizer.ggml.token_type": (types, ARR, gguf.GGUFValueType.INT32)}
    return clone(src, dst, add={"cls.output.weight": head}, meta=meta,
                 drop_meta=("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"))


def tiny_bert(dst, seed=7):
    from edged.format.synth import synth_encoder
    synth_encoder("bert-tiny", "F32", dst, seed=seed)
    return dst


# golden name -> how to build it from a directory for intermediate files
def build(name, tmp):
    if name == "tiny-bert-dense":
        return bert_reranker(tiny_bert(os.path.join(tmp, "tiny.gguf")), os.path.join(tmp, name + ".gguf"),
                             seed=1, dense=True, converter_flags=True)
    if name == "minilm-cross-encoder":     # BertForSequenceClassification: cls.output only
        return bert_reranker(os.path.join(MODELS, "all-MiniLM-L6-v2.Q8_0.gguf"),
                             os.path.join(tmp, name + ".gguf"), seed=2, dense=False)
    if name == "qwen3-reranker":
        return qwen3_reranker(os.path.join(MODELS, "synthetic-qwen3-f32.gguf"),
                              os.path.join(tmp, name + ".gguf"))
    raise KeyError(name)


NAMES = ("tiny-bert-dense", "minilm-cross-encoder", "qwen3-reranker")


def goldens():
    """name -> llama.cpp's {"query", "documents", "tokens", "scores"} (tests/data/goldens)."""
    with open(GOLDENS, encoding="utf-8") as f:
        return json.load(f)
