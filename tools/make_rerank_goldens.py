#!/usr/bin/env python3
"""Make llama.cpp rerank goldens: tests/data/goldens/rerank.json.

The rerankers are built by tests/support/rerank_files.py (a seeded random classification head
added with the PyPI `gguf` writer to a tiny synthetic BERT, to the real all-MiniLM-L6-v2 and
to the synthetic qwen3 of ../shared/testdata/models); the tests rebuild them the same way.
llama.cpp's `llama-embedding --pooling rank` tokenizes each "query<TAB>document" line (the
rerank template when the file has one, else [BOS] query [EOS][SEP] document [EOS] as
llama-server's format_prompt_rerank lays it out), runs it and prints the head's outputs:

  .venv/bin/python tools/make_rerank_goldens.py --llama-embedding PATH/TO/llama-embedding

The golden holds, per file: the query, the documents, llama.cpp's token ids per pair and its
head outputs per pair (n_cls_out values; the first is llama-server's relevance_score).
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


def run(binary, path, query, docs, threads):
    prompt = "\n".join(f"{query}\t{d}" for d in docs)
    # one file for both streams: llama.cpp's logger writes the token lines and the scores
    # from its own thread, in order only there; it sometimes loses its last lines at exit,
    # so a run that printed fewer rows than asked is run again
    for _ in range(20):
        with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
            subprocess.run([binary, "-m", path, "-p", prompt, "--pooling", "rank",
                            "--embd-normalize", "-1", "--embd-output-format", "raw",
                            "--verbose-prompt", "-t", str(threads), "-c", "512", "-b", "512",
                            "-ub", "512", "-fit", "off", "--log-colors", "off"],
                           stdout=log, stderr=log, check=True)
            log.seek(0)
            text = log.read()
        # the token counts and the token lines, each in prompt order
        counts = [int(m) for m in re.findall(r"number of tokens in prompt = (\d+)", text)]
        ids = [int(line.split("->")[0]) for line in text.splitlines()
               if re.match(r"^\s*-?\d+ -> '", line)]
        tokens = []
        for n in counts:
            tokens.append(ids[:n])
            ids = ids[n:]
        scores = [[float(x) for x in line.split()] for line in text.splitlines()
                  if re.fullmatch(r"\s*-?\d+\.\d+( -?\d+\.\d+)*\s*", line)]
        if len(scores) == len(docs) and len(tokens) == len(docs) and all(tokens):
            break
    else:
        sys.exit(f"{path}: expected {len(docs)} rows, got {len(scores)} scores and "
                 f"{len(tokens)} token lists:\n{text}")
    return tokens, scores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-embedding", required=True, help="llama.cpp's llama-embedding")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support")]
    import rerank_files as rf
    golden = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in rf.NAMES:
            path = rf.build(name, tmp)
            tokens, scores = run(a.llama_embedding, path, rf.QUERY, rf.DOCUMENTS, a.threads)
            golden[name] = {"query": rf.QUERY, "documents": rf.DOCUMENTS, "tokens": tokens,
                            "scores": scores}
            print(name, [s[0] for s in scores])
    with open(rf.GOLDENS, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
