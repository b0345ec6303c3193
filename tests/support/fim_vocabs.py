"""Code models' vocabularies for fill-in-the-middle goldens: real vocabularies of
../shared/testdata/vocab (llama.cpp's own test files) with each family's FIM tokens placed where
its models have them, written vocab-only by the PyPI `gguf` writer. tools/make_infill_goldens.py
asks llama.cpp (`llama-tokenize`) which FIM tokens it finds in each and how it tokenizes the
parts of an /infill body (tests/data/goldens/infill.json); tests/text/test_infill.py rebuilds the
same files and checks edged's prompt against llama-server's layout of those ids.

- qwen2.5-coder: the Qwen2 BPE vocabulary, <|fim_prefix|> ... <|file_sep|> at 151659-151664;
- starcoder2: SmolLM2's BPE vocabulary (StarCoder-style), <fim_prefix> ... <file_sep> at 1-6
  as StarCoder2 has them;
- codellama: the Llama 2 SentencePiece vocabulary grown to 32016, ▁<PRE> ▁<SUF> ▁<MID> ▁<EOT>
  at 32007-32010;
- deepseek-coder: the DeepSeek LLM BPE vocabulary with <｜fim▁hole｜> <｜fim▁begin｜> <｜fim▁end｜>
  in three of its padding slots;
- codestral: the Llama 2 SentencePiece vocabulary with Mistral's [PREFIX] [SUFFIX] [MIDDLE]
  control tokens, which llama.cpp does not find by text; "codestral-keys" names them with
  tokenizer.ggml.fim_*_token_id as a converted file must.
"""
import json
import os

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTDATA = os.path.join(ROOT, "..", "shared", "testdata")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "infill.json")
CONTROL, UNUSED = 3, 5

# family -> (source file under ../shared/testdata, {id: token text}, vocabulary size, extra keys)
FAMILIES = {
    "qwen2.5-coder": ("vocab/ggml-vocab-qwen2.gguf",
                      dict(zip(range(151659, 151665), ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                                                       "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"))),
                      None, {}),
    "starcoder2": ("models/SmolLM2-135M-Instruct.Q4_1.gguf",
                   dict(zip(range(1, 7), ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                                          "<repo_name>", "<file_sep>"))), None, {}),
    "codellama": ("vocab/ggml-vocab-llama-spm.gguf",
                  dict(zip(range(32007, 32011), ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"))),
                  32016, {}),
    "deepseek-coder": ("vocab/ggml-vocab-deepseek-llm.gguf",
                       dict(zip(range(100015, 100018), ("<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581begin\uff5c>",
                                                        "<\uff5cfim\u2581end\uff5c>"))), None, {}),
    "codestral": ("vocab/ggml-vocab-llama-spm.gguf",
                  {32000: "[PREFIX]", 32001: "[SUFFIX]", 32002: "[MIDDLE]"}, 32003, {}),
    "codestral-keys": ("vocab/ggml-vocab-llama-spm.gguf",
                       {32000: "[PREFIX]", 32001: "[SUFFIX]", 32002: "[MIDDLE]"}, 32003,
                       {"tokenizer.ggml.fim_pre_token_id": 32000, "tokenizer.ggml.fim_suf_token_id": 32001,
                        "tokenizer.ggml.fim_mid_token_id": 32002}),
}
NAMES = tuple(FAMILIES)

# the parts of one /infill body, as an editor sends them (llama.vim-like), and the fixed texts
# llama-server tokenizes around them (format_prompt_infill)
BODY = {
    "input_prefix": "import os\n\ndef read_config(path):\n    with open(path) as f:\n        ",
    "input_suffix": "\n    return cfg\n\n\nif __name__ == \"__main__\":\n    print(read_config(os.sys.argv[1]))\n",
    "input_extra": [{"filename": "util/io.py", "text": "def load(text):\n    return json.loads(text)\n"},
                    {"text": "DEFAULTS = {\"debug\": False}\n"}],
    "prompt": "cfg = ",
}
FIXED = ("myproject\n", "filename\n", "tmp\n", "util/io.py\n", "\n\n--- snippet ---\n\n")


def _patched(name, toks, types, scores):
    """The family's token texts, types and scores from its source's (lists, changed here)."""
    _, fim, size, _ = FAMILIES[name]
    for i in range(len(toks), size or len(toks)):
        toks.append(f"[PAD{i}]")
        types.append(UNUSED)
        if scores is not None:
            scores.append(0.0)
    for i, text in fim.items():
        toks[i], types[i] = text, CONTROL
    return toks, types, scores


def build(name, dst):
    """Write family `name`'s vocabulary to `dst` (vocab-only GGUF, for llama.cpp); returns dst."""
    src, _, _, keys = FAMILIES[name]
    r = gguf.GGUFReader(os.path.join(TESTDATA, src))
    arch = r.fields["general.architecture"].contents()
    scores = r.fields.get("tokenizer.ggml.scores")
    toks, types, scores = _patched(name, list(r.fields["tokenizer.ggml.tokens"].contents()),
                                   list(r.fields["tokenizer.ggml.token_type"].contents()),
                                   list(scores.contents()) if scores is not None else None)
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k.endswith(".vocab_size"):
            continue
        v = {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": types,
             "tokenizer.ggml.scores": scores}.get(k, f.contents())
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, f.types[0])
    for k, v in keys.items():
        w.add_key_value(k, v, gguf.GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def tokenizer(name):
    """edged's Tokenizer of the same vocabulary as build(name) writes, without writing it."""
    from edged.format.gguf import GGUFFile
    from edged.text.tokenizer import Tokenizer
    src, _, _, keys = FAMILIES[name]
    with GGUFFile.open(os.path.join(TESTDATA, src)) as f:
        md = dict(f.metadata)
    scores = md.get("tokenizer.ggml.scores")
    toks, types, scores = _patched(name, list(md["tokenizer.ggml.tokens"]),
                                   [int(x) for x in md["tokenizer.ggml.token_type"]],
                                   [float(x) for x in scores] if scores is not None else None)
    md.update({"tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": np.array(types, np.int32),
               **keys})
    if scores is not None:
        md["tokenizer.ggml.scores"] = np.array(scores, np.float32)
    return Tokenizer(md, name=name)


def goldens():
    """family -> llama.cpp's {"fim": {"pre": id or None, ...}, "bos": the id it adds or None,
    "eog": its end-of-generation ids,
    "ids": {text: ids without special tokens}}."""
    with open(GOLDENS, encoding="utf-8") as f:
        return json.load(f)
