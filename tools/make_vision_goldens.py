#!/usr/bin/env python3
"""Make llama.cpp vision goldens: tests/data/goldens/vision-NAME.{mmproj.gguf,golden.npz}.

The mmproj file is a small random-weight one written by edged's synthesiser
(edged.format.synth.synth_mmproj, `edged synth --mmproj`), paired with the shared synthetic
text model of its width. The picture is a deterministic pattern (not square, so the resize and
the padding run). llama.cpp's libmtmd (tools/mtmd_teacher.cpp, built against the llama-cpp-python
0.3.36 sdist's build tree) encodes it and evaluates a prompt holding it; the golden holds

  image uint8 (H, W, 3), prompt (str), embd float32 (n_tokens, n_embd) (mtmd_encode_chunk),
  ids int32 (the prompt's tokens, -1 at the image's rows), logits float32 (n_vocab) after the
  last prompt token (mtmd_helper_eval_chunks: the image's rows non-causal for gemma3)

  .venv/bin/python tools/make_vision_goldens.py --teacher /path/to/mtmd_teacher
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "data", "goldens")
MODELS = os.path.join(ROOT, "..", "shared", "testdata", "models")
sys.path.insert(0, ROOT)

# name -> (mmproj shape, text model under ../shared/testdata/models or tests/data/goldens, prompt)
CASES = {
    "gemma3": ("gemma3-tiny", "synthetic-gemma3-f32.gguf", "Look: <__media__> what is it?"),
    # a small llama whose vocabulary has SmolVLM's image tokens (idefics3_text)
    "idefics3": ("idefics3-tiny", "vision-idefics3-text.gguf", "User: <__media__> what is it?"),
    "mlp": ("llava-tiny", "synthetic-llama-f32.gguf", "USER: <__media__>\nwhat is it? ASSISTANT:"),
}


def idefics3_text(out):
    """A 2-layer llama of the idefics3-tiny projector's width (256) whose vocabulary holds the
    tokens mtmd's idefics3 layout looks up: "\n\n" and SmolVLM's added tokens (user-defined),
    for tiles of up to 2 x 2."""
    from edged.format import synth
    extra = [("\n\n", 1), ("<fake_token_around_image>", 4), ("<global-img>", 4), ("<image>", 4)]
    extra += [(f"<row_{y}_col_{x}>", 4) for y in (1, 2) for x in (1, 2)]
    synth.SHAPES["idefics3-text"] = dict(arch="llama", n_embd=256, n_head=4, n_head_kv=2, n_ff=256,
                                         n_layer=2, n_vocab=1024, rope_freq_base=10000.0, rms_eps=1e-5,
                                         n_ctx_train=2048, tied=True, qkv_bias=False, extra_tokens=extra)
    synth.synth("idefics3-text", "F16", out, seed=0)


def picture(h=150, w=200):
    """Diagonal colour bands with noise: every resize weight matters."""
    rng = np.random.default_rng(1)
    base = np.add.outer(np.arange(h), np.arange(w))[:, :, None] * np.array([1, 2, 3])
    return (base % 256).astype(np.uint8) ^ rng.integers(0, 32, (h, w, 3), dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", required=True, help="tools/mtmd_teacher.cpp, built")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    from edged.format.synth import synth_mmproj
    for name in a.cases:
        shape, model, prompt = CASES[name]
        mmproj = os.path.join(OUT, f"vision-{name}.mmproj.gguf")
        synth_mmproj(shape, mmproj, "F16", seed=0)
        if name == "idefics3":
            idefics3_text(os.path.join(OUT, model))
        model = os.path.join(OUT, model) if os.path.exists(os.path.join(OUT, model)) else os.path.join(MODELS, model)
        img = picture()
        with tempfile.TemporaryDirectory() as tmp:
            raw, out = os.path.join(tmp, "img.rgb"), os.path.join(tmp, "out.bin")
            img.tofile(raw)
            subprocess.run([a.teacher, mmproj, model, raw,
                            str(img.shape[1]), str(img.shape[0]), out, prompt],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            d = np.fromfile(out, np.uint8)
        n_img, n_embd, n_p, n_vocab = (int(x) for x in d[:16].view(np.int32))
        o = 16
        embd = d[o:o + 4 * n_img * n_embd].view(np.float32).reshape(n_img, n_embd)
        o += 4 * n_img * n_embd
        ids = d[o:o + 4 * n_p].view(np.int32)
        logits = d[o + 4 * n_p:o + 4 * n_p + 4 * n_vocab].view(np.float32)
        np.savez_compressed(os.path.join(OUT, f"vision-{name}.golden.npz"), image=img,
                            prompt=np.array(prompt), model=np.array(os.path.basename(model)), embd=embd,
                            ids=ids, logits=logits)
        print(f"vision-{name}: {n_img} image rows of {n_embd}, {n_p} prompt tokens")


if __name__ == "__main__":
    main()
