#!/usr/bin/env python3
"""Make llama.cpp fill-in-the-middle goldens: tests/data/goldens/infill.json.

For each code family's vocabulary (tests/support/fim_vocabs.py builds it from a real vocabulary
of ../shared/testdata), llama.cpp's `llama-tokenize` gives the facts llama-server's /infill
prompt is made of (format_prompt_infill, tools/server/server-common.cpp): the FIM tokens
llama_vocab found (its "FIM PRE token = ..." load lines), whether it adds a BOS and which, and
the end-of-generation set, the ids of every text the layout tokenizes (common_tokenize(vocab, text, false, false): the
prefix, suffix, extra chunks, file names, fixed texts and the typed `prompt`, which holds no
control-token text, so parsing special tokens, as tokenize_input_prompts does, changes nothing;
this llama-tokenize has no --parse-special):

  .venv/bin/python tools/make_infill_goldens.py --llama-tokenize PATH/TO/llama-tokenize
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIM_LINE = re.compile(r"print_info: FIM (PRE|SUF|MID|PAD|REP|SEP) token\s+=\s+(-?\d+)")
EOG_LINE = re.compile(r"print_info: EOG token\s+=\s+(-?\d+)")


def tokenize(binary, model, text, tmp, bos=False):
    """llama.cpp's ids of `text` (exact bytes, through a file) and its load log."""
    path = os.path.join(tmp, "text")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    args = [binary, "-m", model, "-f", path, "--no-escape", "--ids", "--log-colors", "off"]
    args += ["-v"] if bos else ["--no-bos"]      # -v: the vocabulary's print_info lines
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    line = [x for x in r.stdout.splitlines() if x.startswith("[")][-1]
    return json.loads(line), r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-tokenize", required=True, help="llama.cpp's llama-tokenize")
    a = ap.parse_args()
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support")]
    import fim_vocabs as fv
    b = fv.BODY
    texts = [b["input_prefix"], b["input_suffix"], b["prompt"], *(c["text"] for c in b["input_extra"]),
             *fv.FIXED]
    golden = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in fv.NAMES:
            model = fv.build(name, os.path.join(tmp, name + ".gguf"))
            first, log = tokenize(a.llama_tokenize, model, "", tmp, bos=True)
            fim = {k.lower(): None for k in ("PRE", "SUF", "MID", "PAD", "REP", "SEP")}
            fim.update({k.lower(): int(v) for k, v in FIM_LINE.findall(log)})
            golden[name] = {
                "fim": fim, "bos": first[0] if first else None,
                "eog": sorted(int(x) for x in EOG_LINE.findall(log)),
                "ids": {t: tokenize(a.llama_tokenize, model, t, tmp)[0] for t in texts}}
            print(name, fim, "bos", golden[name]["bos"])
    with open(fv.GOLDENS, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
