"""Make tests/data/imatrix/llama-quantize-weighted-sha256.json: the sha256 and type of every tensor
llama-quantize writes, with and without an importance matrix, for the mixes whose quantizers
use one (Q4_0..Q5_1, the K-quant mixes) and Q8_0 (which ignores it).

    python tools/make_imatrix_refs.py LLAMA_BIN     (LLAMA_BIN: a directory holding llama-quantize)

Models (F16, written by tools/make_goldens.py's write_gguf, seeds below):
  llama256     tools/make_goldens.py's llama256 (one layer, rows of 256)
  llama256x8   the same shape with 8 layers: the rules that depend on the layer (ffn_down of
               Q4_0/Q5_0 with an imatrix, attn_v/ffn_down "more bits" layers); the matrix has
               entries for blk.0 only, so the other layers are quantized without one
  phi3-256x8   phi3 with fused attn_qkv and gate+up, 8 layers, rows of 256: the fused qkv rules
  qwen3moe     tools/make_goldens.py's qwen3moe (16 experts as 3-D tensors, rows of 64): one
               slice of the matrix per expert
Importance matrices: tests/data/imatrix/llama256.imatrix.gguf (llama-imatrix over
calibration.txt, see llama-quantize-sha256.json) for the first three;
tests/data/imatrix/qwen3moe.imatrix.gguf, made here when missing:
    llama-imatrix -m qwen3moe-F16 -f calibration.txt -c 64 -t 1 -o qwen3moe.imatrix.gguf
"""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data", "imatrix")
IMATRIX = {"llama256": os.path.join(DATA, "llama256.imatrix.gguf"),
           "qwen3moe": os.path.join(DATA, "qwen3moe.imatrix.gguf")}
OUT = os.path.join(DATA, "llama-quantize-weighted-sha256.json")

ALL_MIXES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M",
             "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")


def _make_goldens():
    spec = importlib.util.spec_from_file_location("make_goldens", os.path.join(HERE, "make_goldens.py"))
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    return mg


def models(mg):
    """name -> (case dict, seed); shared with tests/format/test_imatrix_weighted.py"""
    base = mg.CASES["llama256"]
    return {
        "llama256": (base, 1000 + list(mg.CASES).index("llama256")),
        "llama256x8": (dict(base, n_layer=8), 4101),
        "phi3-256x8": (dict(arch="phi3", n_embd=256, head_dim=64, n_ff=256, n_layer=8), 4102),
        "qwen3moe": (mg.CASES["qwen3moe"], 1000 + list(mg.CASES).index("qwen3moe")),
    }


def imatrix_for(model):
    return IMATRIX["qwen3moe" if model == "qwen3moe" else "llama256"]


# (model, mix, with the importance matrix)
RUNS = ([("llama256", m, True) for m in ALL_MIXES]
        + [("llama256x8", m, True) for m in ALL_MIXES if m != "Q2_K_S"]  # refused: blk.1+ have no entry
        + [("phi3-256x8", m, im) for m in ("Q3_K_M", "Q3_K_L", "Q4_K_M", "Q5_K_M") for im in (False, True)]
        + [("qwen3moe", m, True) for m in ("Q4_0", "Q4_1", "Q5_0", "Q5_1")])


def tensor_shas(path):
    import gguf
    r = gguf.GGUFReader(path)
    return {t.name: [t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()] for t in r.tensors}


def main(bin_dir):
    mg = _make_goldens()
    out = {"made_by": "tools/make_imatrix_refs.py with llama-quantize (llama.cpp 0.3.36): "
                      "llama-quantize [--imatrix llama256.imatrix.gguf or qwen3moe.imatrix.gguf] F16 OUT MIX",
           "runs": {}}
    with tempfile.TemporaryDirectory() as d:
        f16 = {}
        for name, (case, seed) in models(mg).items():
            f16[name] = os.path.join(d, name + ".gguf")
            mg.write_gguf(name, case, f16[name], seed=seed)
        if not os.path.exists(IMATRIX["qwen3moe"]):
            subprocess.run([os.path.join(bin_dir, "llama-imatrix"), "-m", f16["qwen3moe"], "-f",
                            os.path.join(DATA, "calibration.txt"), "-c", "64", "-t", "1", "-o",
                            IMATRIX["qwen3moe"]], check=True, capture_output=True)
        for name, mix, im in RUNS:
            q = os.path.join(d, "q.gguf")
            cmd = [os.path.join(bin_dir, "llama-quantize")] + (["--imatrix", imatrix_for(name)] if im else [])
            subprocess.run(cmd + [f16[name], q, mix], check=True, capture_output=True)
            out["runs"][f"{name} {mix} {'imatrix' if im else 'plain'}"] = tensor_shas(q)
    with open(OUT, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
