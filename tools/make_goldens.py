#!/usr/bin/env python3
"""Make llama.cpp goldens for architectures and RoPE variants that ../shared/testdata lacks.

Each case is a small random-weight GGUF written with the PyPI `gguf` writer (independent of
edged's own writer), F16 matrices and F32 norms, a 512-piece SentencePiece vocabulary; then
llama.cpp (through llama-cpp-python, flash attention off, F16 KV cache, n_ctx 512) is run
teacher-forced like ../shared/testdata/golden: the prompt as one batch, then its greedy
continuation one token at a time. The kv-* cases run llama.cpp with a quantized KV cache
(type_k / type_v, llama.cpp's -ctk/-ctv; flash attention on when V is quantized, which
llama.cpp requires) and record which in the golden (`cache_type_k`, `cache_type_v`). Saved next to the model as NAME.golden.npz with `tokens`,
`n_prompt`, `logits` (float32 (n_pos, n_vocab)), the same layout the shared goldens have.

  .venv/bin/python tools/make_goldens.py --llama-python /path/to/venv/bin/python
  .venv/bin/python tools/make_goldens.py --llama-python ... gemma2 qwen3moe   # some cases

Quantized cases (QUANTIZED: NAME-MIX) write the base case's F16 file to a temporary directory,
quantize it with llama.cpp's own llama-quantize (--llama-bin DIR or $EDGED_LLAMA_BIN) and
record the goldens of the quantized file, so the weights are llama.cpp's bytes:

  .venv/bin/python tools/make_goldens.py --llama-python ... --llama-bin DIR gemma2-Q4_0

The interpreter with llama_cpp installed comes from --llama-python or $EDGED_LLAMA_PYTHON.
Output: tests/data/goldens/NAME.gguf and NAME.golden.npz (each well under 300 KB).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "data", "goldens")
N_VOCAB = 512
N_PROMPT, N_GEN = 8, 24

# The shape every case shares (llama.cpp's short names); cases override and add keys.
BASE = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=2,
            rope_freq_base=10000.0, rms_eps=1e-6, n_ctx_train=4096)

CASES = {
    # soft-capped attention (50) and logits (30), sliding window on even layers, sandwich norms
    "gemma2": dict(arch="gemma2", n_swa=8, attn_softcap=50.0, final_softcap=30.0,
                   sandwich=True, tied=True),
    # embedding, residual, attention and logit multipliers
    "granite": dict(arch="granite", embedding_scale=3.0, residual_scale=0.5,
                    attention_scale=0.125, logit_scale=0.5),
    # every fourth layer without RoPE
    "smollm3": dict(arch="smollm3", n_layer=4, n_ff=64, tied=True),
    # Phi-4-mini on phi3: partial rotary (12 of 16 dims), LongRoPE long/short factors,
    # attn_factor, fused qkv and gate+up, tied embeddings; n_ctx 512 > original 32 picks the
    # long factors. (Not named "phi3": llama.cpp would look for Phi-3's special tokens.)
    "phi4mini": dict(arch="phi3", n_rot=12, longrope=True, n_ctx_orig=32, tied=True,
                          rope_attn_factor=1.19),
    # YaRN on qwen2: factor 4 over an original context of 32 (corrections on every dim)
    "qwen2-yarn": dict(arch="qwen2", qkv_bias=True, yarn=4.0, n_ctx_orig=32),
    # a scaled-down Qwen1.5-MoE / Qwen2-57B-A14B: 8 experts, 2 used (weights not
    # renormalised), a shared expert 32 wide behind a sigmoid gate, q/k/v biases
    "qwen2moe": dict(arch="qwen2moe", qkv_bias=True, n_expert=8, n_expert_used=2,
                     n_ff_exp=16, n_ff_shexp=32),
    # a scaled-down Qwen3-30B-A3B: 16 experts, 4 used, expert FFN 16 wide, q/k norms
    "qwen3moe": dict(arch="qwen3moe", qk_norm=True, n_expert=16, n_expert_used=4,
                     n_ff_exp=16, tied=True),
    # rows of 256 (IQ4_XS's super-block), one layer, its own output matrix (logits of unit
    # scale, as the tied 1.0-scale embeddings would not give): the base of the IQ4 files
    "llama256": dict(arch="llama", n_embd=256, head_dim=64, n_ff=256, n_layer=1),
    # a scaled-down gpt-oss-20b: 8 heads of 16 over a 64-wide stream (q wider than n_embd, as
    # 64 x 64 over 2880 there), a learned sink logit per head, q/k/v/o biases, a window of 8
    # on even layers, YaRN (factor 4 over 32), 8 experts with 4 used, softmax over the top-4
    # router logits, router and expert biases (large enough that the clamp at 7 of the
    # SwiGLU acts), the FFN norm stored as post_attention_norm. Seed 2018: the 4th and 5th
    # router logits stay >= 0.007 apart on the golden's tokens and an 80-token prompt (others
    # left near-ties that flip between correct implementations); prompt_seed: the prompt's
    # (the case's index when it was made)
    "gpt-oss": dict(arch="gpt-oss", seed=2018, prompt_seed=7, n_head=8, n_layer=2, n_swa=8,
                    yarn=4.0, n_ctx_orig=32, qkv_bias=True, gptoss=True, n_expert=8,
                    n_expert_used=4, n_ff_exp=32),
    # quantized KV caches on a llama shape whose head_dim holds whole 32-value blocks; a
    # 40-token prompt (a batch past the blocked attention's 32) then 24 single tokens; seeds:
    # their indices when they were made
    "kv-q8_0": dict(arch="llama", seed=1007, prompt_seed=7, n_head=2, n_head_kv=1, head_dim=32,
                    tied=True, cache=("q8_0", "q8_0"), n_prompt=40),
    "kv-q4_0": dict(arch="llama", seed=1008, prompt_seed=8, n_head=2, n_head_kv=1, head_dim=32,
                    tied=True, cache=("q4_0", "q4_0"), n_prompt=40),
    # a quantized K with an F16 V: llama.cpp without flash attention (q8_0 K mul_mat)
    "kv-q8_0-f16": dict(arch="qwen2", seed=1009, prompt_seed=9, qkv_bias=True, n_head=2,
                        n_head_kv=1, head_dim=32, tied=True, cache=("q8_0", "f16"), n_prompt=40),
    # head_dim 64: llama.cpp rotates q, k and v (a Walsh-Hadamard matrix) before a quantized
    # cache stores them, and the attention output back
    "kv-q4_0-hd64": dict(arch="llama", seed=1010, prompt_seed=10, n_head=2, n_head_kv=1, head_dim=64,
                         tied=True, cache=("q4_0", "q4_0"), n_prompt=40),
    # a scaled-down LFM2-350M: gated short convolutions (l_cache 3) on layers 0, 1, 3 and 4,
    # attention with q/k norms on layers 2 and 5 (head_count_kv 0 marks a conv layer), the
    # output norm stored as token_embd_norm, its own output matrix (a varied greedy path); a
    # 40-token prompt
    "lfm2": dict(arch="lfm2", seed=1011, prompt_seed=11, n_layer=6, l_cache=3,
                 attn_layers=(2, 5), qk_norm=True, n_prompt=40),
    # a scaled-down Gemma 4 E2B (text): sliding layers 0, 1, 3 (head dim 16, 16 rotated, base
    # 1e4, window 8) and full layers 2, 4 (head dim 32, proportional RoPE through rope_freqs,
    # base 1e6); KV heads per layer; layers 3 and 4 reuse the KV of layers 1 and 2
    # (shared_kv_layers 2) and have a double-wide FFN; layer 2 has no attn_v (V = K); V is
    # RMS-normed, attention unscaled; per-layer embeddings 8 wide; a scalar per layer output;
    # logits soft-capped at 30; a 40-token prompt. Written by write_gemma4_gguf.
    "gemma4": dict(arch="gemma4", seed=1012, prompt_seed=12, n_prompt=40),
    # a scaled-down Gemma 4 26B-A4B: the sliding/full layers and head sizes above, no shared KV
    # layers and no per-layer embeddings, full layers without attn_v; every layer a dense FFN
    # 32 wide (the shared expert) beside 8 routed experts 16 wide, 3 per token, the router on
    # its own norm and scale, each expert's output scaled (ffn_down_exps.scale); layer 0 with
    # ffn_gate_exps and ffn_up_exps, the others with them fused (ffn_gate_up_exps, as the
    # converter writes them now). Written by write_gemma4_gguf.
    "gemma4-moe": dict(arch="gemma4", moe=True, seed=1013, prompt_seed=13, n_prompt=40),
    # a scaled-down Gemma 3n E2B: 22 layers (the first 10 with the FFN gate's Gaussian top-k,
    # layers 20 (sliding) and 21 (global) attending to layers 18's and 19's K/V), AltUp's 4
    # streams, LAuReL of rank 64 and per-layer inputs 256 wide (llama.cpp's fixed sizes), a
    # window of 8 on the layers the per-layer pattern marks, tied embeddings; a 40-token
    # prompt. 8.6 MB in F16: not committed, tests/engine/test_engine_gemma3n.py writes it
    # again with write_gguf and checks its SHA-256 against the golden's `gguf_sha256`
    "gemma3n": dict(arch="gemma3n", seed=1012, prompt_seed=12, n_layer=22, n_ff=512, n_swa=8,
                    qk_norm=True, q_norm=(0.25, 0.35), sandwich=True, n_prompt=40),
    # a scaled-down Granite 4.0-H: 5 layers, attention on 1 and 4 and Mamba-2 elsewhere
    # (d_inner 128 = 2 * n_embd, 8 SSM heads of 16, state 16, 2 groups, 4 conv taps, conv
    # bias), granite's multipliers, tied embeddings; a 40-token prompt. Written again by the
    # test (REGENERATED) like gemma3n
    "granitehybrid": dict(arch="granitehybrid", seed=1013, prompt_seed=13, n_layer=5,
                          attn_layers=(1, 4), ssm=dict(d_conv=4, d_state=16, n_head=8, n_group=2),
                          embedding_scale=2.0, residual_scale=0.5, attention_scale=0.125,
                          logit_scale=0.5, tied=True, n_prompt=40),
    # the same shape with llama.cpp's granite MoE FFN in every layer: 8 experts of 32
    # (feed_forward_length), 2 per token (weights renormalised), an ungated shared expert of 32
    "granitehybrid-moe": dict(arch="granitehybrid", seed=1014, prompt_seed=14, n_layer=5,
                              attn_layers=(1, 4), ssm=dict(d_conv=4, d_state=16, n_head=8, n_group=2),
                              embedding_scale=2.0, residual_scale=0.5, attention_scale=0.125,
                              logit_scale=0.5, tied=True, n_prompt=40, n_ff=32, n_expert=8,
                              n_expert_used=2, n_ff_exp=32, n_ff_shexp=32),
    # a scaled-down Qwen3.5: Gated DeltaNet on layers 0-2 (full_attention_interval 4), gated
    # attention with q/k norms on layer 3; DeltaNet heads of 16 (ssm.state_size), 2 key heads
    # and 4 value heads (value head h reads key head h % 2), a 4-tap convolution; attention
    # heads of 32 with 16 rotated dims in interleaved M-RoPE sections (3, 3, 2, 0); the FFN
    # norm stored as post_attention_norm; a 40-token prompt
    "qwen35": dict(arch="qwen35", seed=1012, prompt_seed=12, n_layer=4, head_dim=32, n_rot=16,
                   qk_norm=True, ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=4),
                   sections=(3, 3, 2, 0), n_prompt=40),
    # the same shape as qwen35moe: 8 experts of 16, 2 per token (weights renormalised), a
    # shared expert 32 wide behind a sigmoid gate, in every layer
    "qwen35moe": dict(arch="qwen35moe", seed=1013, prompt_seed=13, n_layer=4, head_dim=32,
                      n_rot=16, qk_norm=True, ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=4),
                      sections=(3, 3, 2, 0), n_prompt=40, n_expert=8, n_expert_used=2,
                      n_ff_exp=16, n_ff_shexp=32),
}
# gpt-oss as it ships: the same file with its experts in MXFP4, quantized by the PyPI gguf
# package (llama-quantize's MXFP4_MOE would also make the rest Q8_0, which this machine's
# llama.cpp build cannot run)
CASES["gpt-oss-mxfp4"] = dict(CASES["gpt-oss"], mxfp4=True, prompt_seed=8)

# cases whose model is too large to commit: written to a temporary directory, the golden records
# its SHA-256 (`gguf_sha256`) and the test writes it again with write_gguf
REGENERATED = {"gemma3n", "granitehybrid", "granitehybrid-moe"}

GGML_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 8}  # the ggml type ids llama.cpp's type_k/type_v take

# NAME-MIX: the base case quantized by llama-quantize. The base shapes are 64 wide, so the
# K-quant mixes would fall back to 32-block types everywhere: Q4_0 and Q8_0 stand for them.
# qwen3moe's experts are 16 wide: MXFP4_MOE gives MXFP4 gate/up experts, F16 down experts.
QUANTIZED = {f"{base}-{mix}": (base, mix)
             for base in ("gemma2", "granite", "smollm3", "qwen2-yarn", "qwen2moe", "qwen3moe")
             for mix in ("Q4_0", "Q8_0")}
QUANTIZED.update({"llama256-IQ4_NL": ("llama256", "IQ4_NL"), "llama256-IQ4_XS": ("llama256", "IQ4_XS"),
                  "qwen3moe-MXFP4_MOE": ("qwen3moe", "MXFP4_MOE")})

LLAMA_TEACHER = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
path, out, prompt, n_gen = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
type_k, type_v = int(sys.argv[5]), int(sys.argv[6])   # ggml type ids of the KV cache
llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, logits_all=True,
            flash_attn=type_v != 1, type_k=type_k, type_v=type_v, verbose=False, seed=0)
llm.reset()
llm.eval(prompt)                        # the prompt as one batch
rows = [np.array(llm.scores[:len(prompt)], dtype=np.float32)]
toks = list(prompt)
for _ in range(n_gen):                  # greedy continuation, one token at a time
    t = int(np.argmax(rows[-1][-1]))
    toks.append(t)
    llm.eval([t])
    rows.append(np.array(llm.scores[len(toks) - 1:len(toks)], dtype=np.float32))
np.savez_compressed(out, tokens=np.array(toks, np.int32), n_prompt=np.int32(len(prompt)),
                    logits=np.concatenate(rows), cache_type_k=sys.argv[7], cache_type_v=sys.argv[8])
"""


def teacher_c(binary, model, golden, prompt, ck, cv):
    """The LLAMA_TEACHER recording through tools/llama_teacher.cpp (F16 KV cache)."""
    if (ck, cv) != ("f16", "f16"):
        sys.exit("--llama-teacher records F16 KV caches only")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.bin")
        subprocess.run([binary, model, out, str(N_GEN), *map(str, prompt)], check=True,
                       capture_output=True)
        raw = np.fromfile(out, dtype=np.int32)
    n_pos, n_vocab = int(raw[0]), int(raw[1])
    toks = raw[2:2 + n_pos]
    logits = raw[2 + n_pos:].view(np.float32).reshape(n_pos, n_vocab)
    np.savez_compressed(golden, tokens=toks, n_prompt=np.int32(len(prompt)), logits=logits,
                        cache_type_k=ck, cache_type_v=cv)


def vocab():
    """<unk> <s> </s>, 256 byte pieces, then characters and pairs (edged's synthetic SPM)."""
    sys.path.insert(0, ROOT)
    from edged.format.synth import synth_vocab
    return synth_vocab(N_VOCAB)


def add_vocab(w):
    toks, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores.tolist())
    w.add_token_types(types.tolist())
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)


def random_writers(w, rng):
    """mat(name, *shape): F16 normal values (scale 1/sqrt(row length) unless given); vec(name,
    n): F32 uniform in lo..hi."""
    def mat(tname, *shape, scale=None):
        # shape in numpy order (rows..., row length). F16: this llama.cpp build's quantized
        # CPU kernels stop with SIGILL on this machine (AMX/VNNI under the sandbox)
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        w.add_tensor(tname, (rng.standard_normal(shape) * s).astype(np.float16))

    def vec(tname, n, lo=0.8, hi=1.2):
        w.add_tensor(tname, rng.uniform(lo, hi, n).astype(np.float32))
    return mat, vec


def write_gguf(name, c, path, seed):
    import gguf
    rng = np.random.default_rng(seed)
    c = {**BASE, **c}
    arch, E, H, KV, D = c["arch"], c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"]
    F, L = c["n_ff"], c["n_layer"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"edged-golden-{name}")
    w.add_context_length(c["n_ctx_train"])
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    if arch == "lfm2":      # per layer: 0 on the convolution layers
        w.add_head_count_kv([KV if il in c["attn_layers"] else 0 for il in range(L)])
        w.add_shortconv_l_cache(c["l_cache"])
    elif arch == "granitehybrid":  # per layer: 0 on the Mamba-2 layers
        w.add_head_count_kv([KV if il in c["attn_layers"] else 0 for il in range(L)])
        S = c["ssm"]
        DI, DS, SH, SG = 2 * E, S["d_state"], S["n_head"], S["n_group"]
        CH = DI + 2 * SG * DS
        w.add_ssm_conv_kernel(S["d_conv"])
        w.add_ssm_inner_size(DI)
        w.add_ssm_state_size(DS)
        w.add_ssm_time_step_rank(SH)
        w.add_ssm_group_count(SG)
    else:
        w.add_head_count_kv(KV)
    if arch.startswith("qwen35"):
        ssm = c["ssm"]
        w.add_ssm_conv_kernel(ssm["d_conv"])
        w.add_ssm_state_size(ssm["d_state"])
        w.add_ssm_group_count(ssm["n_group"])
        w.add_ssm_time_step_rank(ssm["dt_rank"])
        w.add_ssm_inner_size(ssm["d_state"] * ssm["dt_rank"])
        w.add_full_attention_interval(4)
        w.add_rope_dimension_sections(list(c["sections"]))
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_dimension_count(c.get("n_rot", D))
    w.add_rope_freq_base(c["rope_freq_base"])
    w.add_layer_norm_rms_eps(c["rms_eps"])
    if "n_swa" in c:
        w.add_sliding_window(c["n_swa"])
    if arch == "gemma3n":   # the keys its converter writes (llama.cpp uses fixed values)
        A, P, R = 4, 256, 64
        w.add_sliding_window_pattern([il % 5 < 4 for il in range(20)] + [True, False][:L - 20])
        w.add_altup_active_idx(0)
        w.add_altup_num_inputs(A)
        w.add_embedding_length_per_layer_input(P)
        w.add_shared_kv_layers(max(0, L - 20))
        w.add_activation_sparsity_scale([1.6448533535003662] * 10 + [-np.inf] * (L - 10))
        w.add_final_logit_softcapping(30.0)
    if "attn_softcap" in c:
        w.add_attn_logit_softcapping(c["attn_softcap"])
        w.add_final_logit_softcapping(c["final_softcap"])
    if "embedding_scale" in c:
        w.add_embedding_scale(c["embedding_scale"])
        w.add_residual_scale(c["residual_scale"])
        w.add_attention_scale(c["attention_scale"])
        w.add_logit_scale(c["logit_scale"])
    if c.get("longrope"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        w.add_rope_scaling_orig_ctx_len(c["n_ctx_orig"])
        w.add_rope_scaling_attn_factors(c["rope_attn_factor"])
    if "yarn" in c:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(c["yarn"])
        w.add_rope_scaling_orig_ctx_len(c["n_ctx_orig"])
    if "n_expert" in c:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_feed_forward_length(c["n_ff_exp"])
    if "n_ff_shexp" in c:
        w.add_expert_shared_feed_forward_length(c["n_ff_shexp"])
    add_vocab(w)

    mat, vec = random_writers(w, rng)

    def mxfp4(tname, *shape):
        # the same random draw as mat(), quantized to MXFP4 by gguf-py (not by edged)
        data = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.MXFP4)
        w.add_tensor(tname, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)

    experts = _experts_writer(w, c, rng, mat, mxfp4)

    def dense_ffn(p):   # the FFN after a convolution / Mamba-2 layer (lfm2, granitehybrid)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", F, E)
        mat(p + "ffn_up.weight", F, E)
        mat(p + "ffn_down.weight", E, F)

    mat("token_embd.weight", N_VOCAB, E, scale=1.0)
    vec("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", E)
    if not c.get("tied"):
        mat("output.weight", N_VOCAB, E)
    if c.get("longrope"):
        half = c["n_rot"] // 2
        w.add_tensor("rope_factors_long.weight", rng.uniform(1.0, 8.0, half).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", rng.uniform(1.0, 1.5, half).astype(np.float32))
    if arch == "gemma3n":
        def f32(tname, *shape, scale):
            w.add_tensor(tname, (rng.standard_normal(shape) * scale).astype(np.float32))
        mat("altup_proj.weight", A - 1, E, E)
        mat("altup_unembd_proj.weight", A - 1, E, E)
        mat("per_layer_token_embd.weight", N_VOCAB, P * L, scale=1.0 / 16)
        mat("per_layer_model_proj.weight", P * L, E)
        vec("per_layer_proj_norm.weight", P)
    for il in range(L):
        p = f"blk.{il}."
        if arch == "gemma3n":
            mat(p + "inp_gate.weight", P, E)
            mat(p + "proj.weight", E, P)
            vec(p + "post_norm.weight", E)
            f32(p + "altup_correct_coef.weight", A, A, scale=0.02)
            vec(p + "altup_correct_scale.weight", E)
            f32(p + "altup_predict_coef.weight", A * A, A, scale=0.02)
            f32(p + "altup_router.weight", A, E, scale=4.0)
            vec(p + "altup_router_norm.weight", E)
            mat(p + "laurel_l.weight", R, E)
            mat(p + "laurel_r.weight", E, R)
            vec(p + "laurel_post_norm.weight", E)
        vec(p + "attn_norm.weight", E)
        if arch == "granitehybrid" and il not in c["attn_layers"]:
            def f32(tname, *shape, scale=1.0, lo=None):
                a = rng.standard_normal(shape) * scale if lo is None else \
                    rng.uniform(lo, scale, shape)
                w.add_tensor(tname, a.astype(np.float32))
            mat(p + "ssm_in.weight", DI + CH + SH, E)
            f32(p + "ssm_conv1d.weight", CH, S["d_conv"], scale=0.5)
            f32(p + "ssm_conv1d.bias", CH, scale=0.1)
            f32(p + "ssm_dt.bias", SH, scale=-1.0, lo=-4.0)     # softplus -> 0.02..0.3
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(0.0, 2.0, (SH, 1))).astype(np.float32))
            f32(p + "ssm_d", SH, 1, scale=1.0, lo=0.5)
            vec(p + "ssm_norm.weight", (SG, DI // SG))
            mat(p + "ssm_out.weight", E, DI)
            if "n_expert" in c:
                vec(p + "ffn_norm.weight", E)
                experts(p)
            else:
                dense_ffn(p)
            continue
        if arch == "lfm2" and il not in c["attn_layers"]:
            mat(p + "shortconv.in_proj.weight", 3 * E, E)
            w.add_tensor(p + "shortconv.conv.weight",
                         (rng.standard_normal((E, c["l_cache"])) * 0.5).astype(np.float32))
            mat(p + "shortconv.out_proj.weight", E, E)
            dense_ffn(p)
            continue
        recr = arch in ("qwen35", "qwen35moe") and (il + 1) % 4
        if recr:   # a Gated DeltaNet layer
            ssm = c["ssm"]
            S, Hk, Hv = ssm["d_state"], ssm["n_group"], ssm["dt_rank"]
            C = S * (2 * Hk + Hv)
            mat(p + "attn_qkv.weight", C, E)
            mat(p + "attn_gate.weight", S * Hv, E)
            w.add_tensor(p + "ssm_conv1d.weight",
                         (rng.standard_normal((C, ssm["d_conv"])) * 0.5).astype(np.float32))
            vec(p + "ssm_dt.bias", Hv, -1.0, 1.0)
            vec(p + "ssm_a", Hv, -2.0, -0.2)       # -exp(A_log)
            mat(p + "ssm_beta.weight", Hv, E)
            mat(p + "ssm_alpha.weight", Hv, E)
            vec(p + "ssm_norm.weight", S)
            mat(p + "ssm_out.weight", E, S * Hv)
        elif arch == "phi3":
            mat(p + "attn_qkv.weight", H * D + 2 * KV * D, E)
        else:
            mat(p + "attn_q.weight", (2 if arch.startswith("qwen35") else 1) * H * D, E)  # qwen35: q | gate
            mat(p + "attn_k.weight", KV * D, E)
            mat(p + "attn_v.weight", KV * D, E)
        if not recr:
            if c.get("qkv_bias"):
                vec(p + "attn_q.bias", H * D, -0.1, 0.1)
                vec(p + "attn_k.bias", KV * D, -0.1, 0.1)
                vec(p + "attn_v.bias", KV * D, -0.1, 0.1)
            if c.get("qk_norm"):
                vec(p + "attn_q_norm.weight", D, *c.get("q_norm", (0.8, 1.2)))
                vec(p + "attn_k_norm.weight", D)
            mat(p + "attn_output.weight", E, H * D)
            if c.get("gptoss"):
                w.add_tensor(p + "attn_output.bias", rng.uniform(-0.1, 0.1, E).astype(np.float32))
                w.add_tensor(p + "attn_sinks.weight", rng.uniform(-1.0, 3.0, H).astype(np.float32))
            if c.get("sandwich"):
                vec(p + "post_attention_norm.weight", E)
                vec(p + "post_ffw_norm.weight", E)
        # gpt-oss names the FFN's input norm post_attention_norm
        vec(p + ("post_attention_norm.weight" if c.get("gptoss") or arch.startswith("qwen35")
                 else "ffn_norm.weight"), E)
        if "n_expert" in c:
            experts(p)
        elif arch == "phi3":
            mat(p + "ffn_up.weight", 2 * F, E)
            mat(p + "ffn_down.weight", E, F)
        else:
            mat(p + "ffn_gate.weight", F, E)
            mat(p + "ffn_up.weight", F, E)
            mat(p + "ffn_down.weight", E, F)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _experts_writer(w, c, rng, mat, mxfp4):
    def experts(p):   # router, routed experts (gpt-oss: biases), shared expert
        E = c["n_embd"]
        X, Fe = c["n_expert"], c["n_ff_exp"]
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((X, E)) / np.sqrt(E)).astype(np.float32))
        emat = mxfp4 if c.get("mxfp4") else mat
        emat(p + "ffn_gate_exps.weight", X, Fe, E)
        emat(p + "ffn_up_exps.weight", X, Fe, E)
        emat(p + "ffn_down_exps.weight", X, E, Fe)
        if c.get("gptoss"):
            for tname, shape, sd in (("ffn_gate_inp.bias", (X,), 0.5),
                                     ("ffn_gate_exps.bias", (X, Fe), 4.0),
                                     ("ffn_up_exps.bias", (X, Fe), 4.0),
                                     ("ffn_down_exps.bias", (X, E), 0.1)):
                w.add_tensor(p + tname, (rng.standard_normal(shape) * sd).astype(np.float32))
        if "n_ff_shexp" in c:
            Fs = c["n_ff_shexp"]
            if c["arch"] != "granitehybrid":   # granite's shared expert has no gate
                w.add_tensor(p + "ffn_gate_inp_shexp.weight",
                             (rng.standard_normal(E) / np.sqrt(E)).astype(np.float32))
            mat(p + "ffn_gate_shexp.weight", Fs, E)
            mat(p + "ffn_up_shexp.weight", Fs, E)
            mat(p + "ffn_down_shexp.weight", E, Fs)
    return experts


def write_gemma4_gguf(name, path, seed, moe=False):
    """The gemma4 cases: per-layer head sizes, KV heads, FFN widths and KV sharing, which the
    shared shape of write_gguf has no room for (keys and tensors as llama.cpp's gemma4 loader
    reads them); moe: the 26B-A4B layout (routed experts beside the dense FFN)."""
    import gguf
    rng = np.random.default_rng(seed)
    E, H, L, P = 64, 4, 5, (0 if moe else 8)
    swa = [True, True, False, True, False]
    kv = [2, 2, 1, 2, 1]
    ff = [32] * L if moe else [32, 32, 32, 64, 64]
    D, Dswa, n_shared = 32, 16, (0 if moe else 2)
    X, K, Fe = 8, 3, 16
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_name(f"edged-golden-{name}")
    w.add_context_length(4096)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_array("gemma4.feed_forward_length", ff)
    w.add_head_count(H)
    w.add_array("gemma4.attention.head_count_kv", kv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_uint32("gemma4.attention.key_length_swa", Dswa)
    w.add_uint32("gemma4.attention.value_length_swa", Dswa)
    w.add_rope_dimension_count(D)
    w.add_uint32("gemma4.rope.dimension_count_swa", Dswa)
    w.add_rope_freq_base(1e6)
    w.add_float32("gemma4.rope.freq_base_swa", 1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(8)
    w.add_array("gemma4.attention.sliding_window_pattern", swa)
    w.add_uint32("gemma4.attention.shared_kv_layers", n_shared)
    w.add_uint32("gemma4.embedding_length_per_layer_input", P)
    w.add_final_logit_softcapping(30.0)
    if moe:
        w.add_expert_count(X)
        w.add_expert_used_count(K)
        w.add_expert_feed_forward_length(Fe)
    add_vocab(w)

    mat, vec = random_writers(w, rng)
    mat("token_embd.weight", N_VOCAB, E, scale=1.0)
    vec("output_norm.weight", E)
    w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 4.0, D // 2).astype(np.float32))
    if P:
        mat("per_layer_token_embd.weight", N_VOCAB, P * L, scale=1.0)
        mat("per_layer_model_proj.weight", P * L, E)
        vec("per_layer_proj_norm.weight", P)
    for il in range(L):
        p, hd = f"blk.{il}.", Dswa if swa[il] else D
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", H * hd, E)
        vec(p + "attn_q_norm.weight", hd)
        if il < L - n_shared:
            mat(p + "attn_k.weight", kv[il] * hd, E)
            vec(p + "attn_k_norm.weight", hd)
            if swa[il] if moe else il != 2:
                mat(p + "attn_v.weight", kv[il] * hd, E)
        mat(p + "attn_output.weight", E, H * hd)
        vec(p + "post_attention_norm.weight", E)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", ff[il], E)
        mat(p + "ffn_up.weight", ff[il], E)
        mat(p + "ffn_down.weight", E, ff[il])
        vec(p + "post_ffw_norm.weight", E)
        if moe:   # the router's logits spread wide (routing decided, as trained ones are)
            w.add_tensor(p + "ffn_gate_inp.weight",
                         (rng.standard_normal((X, E)) * 8.0).astype(np.float32))
            vec(p + "ffn_gate_inp.scale", E)
            for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vec(p + norm + ".weight", E)
            if il == 0:
                mat(p + "ffn_gate_exps.weight", X, Fe, E)
                mat(p + "ffn_up_exps.weight", X, Fe, E)
            else:
                mat(p + "ffn_gate_up_exps.weight", X, 2 * Fe, E)
            mat(p + "ffn_down_exps.weight", X, E, Fe)
            vec(p + "ffn_down_exps.scale", X, 0.5, 1.5)
        if P:
            mat(p + "inp_gate.weight", P, E)
            mat(p + "proj.weight", E, P)
            vec(p + "post_norm.weight", E)
        vec(p + "layer_output_scale.weight", 1, 0.5, 1.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python with llama_cpp installed (or $EDGED_LLAMA_PYTHON)")
    ap.add_argument("--llama-bin", default=os.environ.get("EDGED_LLAMA_BIN"),
                    help="directory with llama.cpp's llama-quantize (or $EDGED_LLAMA_BIN), "
                         "for the quantized cases")
    ap.add_argument("--llama-teacher", default=os.environ.get("EDGED_LLAMA_TEACHER"),
                    help="tools/llama_teacher.cpp built against llama.cpp (or "
                         "$EDGED_LLAMA_TEACHER): the same teacher forcing without llama-cpp-python "
                         "(F16 KV cache only)")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("cases", nargs="*", help=f"subset of: {', '.join([*CASES, *QUANTIZED])} "
                                             "(default: the F16 cases)")
    a = ap.parse_args()
    if not a.llama_python and not a.llama_teacher:
        ap.error("--llama-python (or $EDGED_LLAMA_PYTHON) or --llama-teacher is required")
    os.makedirs(a.out, exist_ok=True)
    index = {name: i for i, name in enumerate(CASES)}
    for name in a.cases or [n for n in CASES if n != "llama256"]:
        if name not in CASES and name not in QUANTIZED:
            ap.error(f"unknown case {name!r}")
        base, mix = QUANTIZED.get(name, (name, None))
        i = index[base]
        tmp = tempfile.TemporaryDirectory() if name in REGENERATED else None
        model = os.path.join(tmp.name if tmp else a.out, f"synthetic-{name}.gguf")
        golden = os.path.join(a.out, f"synthetic-{name}.golden.npz")
        case = dict(CASES[base])
        seed, i = case.pop("seed", 1000 + i), case.pop("prompt_seed", i)
        n_prompt = case.pop("n_prompt", N_PROMPT)
        ck, cv = case.pop("cache", ("f16", "f16"))
        if case.get("arch") == "gemma4":
            write_gemma4_gguf(name, model, seed=seed, moe=case.get("moe", False))
        elif mix is None:
            write_gguf(name, case, model, seed=seed)
        else:
            if not a.llama_bin:
                ap.error("--llama-bin (or $EDGED_LLAMA_BIN) is required for quantized cases")
            with tempfile.TemporaryDirectory() as tmp:
                f16 = os.path.join(tmp, "f16.gguf")
                write_gguf(base, case, f16, seed=seed)
                subprocess.run([os.path.join(a.llama_bin, "llama-quantize"), f16, model, mix, "2"],
                               check=True, capture_output=True)
        prompt = [1] + np.random.default_rng(i).integers(3, N_VOCAB, n_prompt - 1).tolist()
        if a.llama_python:
            subprocess.run([a.llama_python, "-c", LLAMA_TEACHER, model, golden, json.dumps(prompt),
                            str(N_GEN), str(GGML_TYPE[ck]), str(GGML_TYPE[cv]), ck, cv], check=True)
        else:
            teacher_c(a.llama_teacher, model, golden, prompt, ck, cv)
        if tmp:
            import hashlib
            with open(model, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            z = dict(np.load(golden))
            np.savez_compressed(golden, gguf_sha256=sha, **z)
        print(f"{name}: {os.path.getsize(model)} + {os.path.getsize(golden)} bytes", flush=True)
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
