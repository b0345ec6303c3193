#!/usr/bin/env python3
"""Structured output on a small model: over the schemas of tests/data/json_schemas.json x seeds,
how often the reply is JSON that parses, and how often it validates, within max_tokens.

Three ways, same model file, same chat prompt, same sampler settings (llama.cpp's defaults:
temperature 0.8, top-k 40, top-p 0.95, min-p 0.05):
  before     the schema handed to llguidance as it is (what edged did before grammar.llama_like)
  after      grammar.from_json_schema: the schema read as llama.cpp reads it (grammar.llama_like)
  llama.cpp  `llama-completion --json-schema-file` (its own converter and sampler), if given
"Valid" is jsonschema's check against the schema with its objects closed as llama.cpp closes
them (an extra key counts as invalid), without the digit bounds llama_like adds (which only
make the reply end).

  .venv/bin/python tools/bench_json_schema.py [--model M.gguf] [--seeds 4] [-n 128] \
      [--llama-completion PATH/llama-completion]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import jsonschema  # noqa: E402
import llguidance  # noqa: E402

from edged.engine.model import Model  # noqa: E402
from edged.text import grammar  # noqa: E402
from edged.text.sampling import Sampler, SamplingParams  # noqa: E402

MODEL = os.path.join(ROOT, "..", "shared", "testdata", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SCHEMAS = os.path.join(ROOT, "tests", "data", "json_schemas.json")
SYSTEM = "You are a helpful assistant. Answer with JSON only."
SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def messages(case):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": case["prompt"]}]


def edged_reply(model, case, seed, n, rewrite):
    """The text edged generates for `case` under its schema (rewritten or as given)."""
    tok = model.tokenizer
    if rewrite:
        g = grammar.from_json_schema(case["schema"])
    else:
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(case["schema"]),
                                                          defaults=grammar.JSON_LAYOUT)
    constraint = grammar.Constraint(grammar.check(g, tok, model.n_vocab), tok, model.n_vocab)
    ids = model.encode_chat(messages(case))
    s = model.session(n_ctx=len(ids) + n + 8)
    sampler = Sampler(model.n_vocab, SamplingParams(seed=seed, **SAMPLING), constraint=constraint)
    logits, out = s.eval(ids), []
    for _ in range(n):
        t = sampler.sample(logits[-1])
        if t in tok.eog_ids:
            break
        sampler.accept(t)
        out.append(t)
        logits = s.eval([t])
    s.close()
    return tok.decode(out)


def llama_reply(binary, model_path, prompt, case, seed, n):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(case["schema"], f)
        f.flush()
        cmd = [binary, "-m", model_path, "-p", prompt, "-no-cnv", "--no-display-prompt",
               "--no-warmup", "-n", str(n), "-s", str(seed), "--temp", str(SAMPLING["temperature"]),
               "--top-k", str(SAMPLING["top_k"]), "--top-p", str(SAMPLING["top_p"]),
               "--min-p", str(SAMPLING["min_p"]), "-t", "2", "-c", "1024", "--json-schema-file", f.name]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    text = r.stdout.strip()
    return text[:-len(END)].rstrip() if text.endswith(END) else text


END = "[end of text]"      # what llama-completion prints after an end token


def closed(schema):
    """grammar.llama_like(schema) without the bounds it adds to numbers."""
    added = {"minimum": -grammar.INT_LIMIT, "maximum": grammar.INT_LIMIT, "multipleOf": grammar.FRACTION}

    def strip(x):
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not (k in added and v == added[k])}
        return x
    return strip(grammar.llama_like(schema))


def judge(text, schema):
    """(parses, valid) of a reply."""
    try:
        v = json.loads(text)
    except ValueError:
        return False, False
    try:
        jsonschema.validate(v, closed(schema))
    except jsonschema.ValidationError:
        return True, False
    return True, True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--schemas", default=SCHEMAS)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("-n", type=int, default=128, help="max tokens per reply")
    ap.add_argument("--llama-completion", help="llama.cpp's llama-completion binary")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every reply")
    a = ap.parse_args()
    cases = json.load(open(a.schemas))
    model = Model.load(a.model, n_threads=2)
    modes = ["before", "after"] + (["llama.cpp"] if a.llama_completion else [])
    totals = {m: [0, 0] for m in modes}
    print(f"| schema | {' | '.join(f'{m} parse/valid' for m in modes)} |")
    print(f"|---|{'---|' * len(modes)}")
    for case in cases:
        row = {m: [0, 0] for m in modes}
        prompt = model.chat_prompt(messages(case), True)
        for seed in range(a.seeds):
            for m in modes:
                text = (llama_reply(a.llama_completion, a.model, prompt, case, seed, a.n) if m == "llama.cpp"
                        else edged_reply(model, case, seed, a.n, m == "after"))
                ok = judge(text, case["schema"])
                for i in (0, 1):
                    row[m][i] += ok[i]
                    totals[m][i] += ok[i]
                if a.verbose:
                    print(f"  {case['name']} seed {seed} {m}: {ok} {text[:160]!r}", file=sys.stderr)
        print(f"| {case['name']} | {' | '.join(f'{row[m][0]}/{row[m][1]}' for m in modes)} |", flush=True)
    n = len(cases) * a.seeds
    print(f"| **all ({n})** | {' | '.join(f'{totals[m][0]}/{totals[m][1]}' for m in modes)} |")


if __name__ == "__main__":
    main()
