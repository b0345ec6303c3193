#!/usr/bin/env python3
"""Check the synthetic-lfm2 golden against Hugging Face transformers' own LFM2 (Lfm2ForCausalLM,
float64): the GGUF's weights loaded into it, the golden's tokens teacher-forced in one pass, its
logits against llama.cpp's. Run in a venv with torch, transformers (>= 4.54) and gguf:

    python tools/lfm2_hf_check.py tests/data/goldens/synthetic-lfm2

Measured: max 0.0044, mean 0.00068, the same top-1 on every row (llama.cpp computes in float32).
"""
import sys

import gguf
import numpy as np
import torch
from transformers import Lfm2Config, Lfm2ForCausalLM

r = gguf.GGUFReader(sys.argv[1] + '.gguf')
T = {t.name: np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
kv = r.fields['lfm2.attention.head_count_kv'].contents()
L = len(kv)
cfg = Lfm2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=L,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                 norm_eps=1e-6, tie_word_embeddings=False, conv_L_cache=3,
                 block_auto_adjust_ff_dim=False,
                 layer_types=["full_attention" if k else "conv" for k in kv],
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
m = Lfm2ForCausalLM(cfg).double().eval()
sd = {"model.embed_tokens.weight": T["token_embd.weight"], "model.embedding_norm.weight": T["token_embd_norm.weight"],
      "lm_head.weight": T["output.weight"]}
for i in range(L):
    p, h = f"blk.{i}.", f"model.layers.{i}."
    sd[h + "operator_norm.weight"] = T[p + "attn_norm.weight"]
    sd[h + "ffn_norm.weight"] = T[p + "ffn_norm.weight"]
    for a, b in (("ffn_gate", "w1"), ("ffn_up", "w3"), ("ffn_down", "w2")):
        sd[h + f"feed_forward.{b}.weight"] = T[p + a + ".weight"]
    if kv[i]:
        for a, b in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "out_proj"),
                     ("attn_q_norm", "q_layernorm"), ("attn_k_norm", "k_layernorm")):
            sd[h + f"self_attn.{b}.weight"] = T[p + a + ".weight"]
    else:
        sd[h + "conv.in_proj.weight"] = T[p + "shortconv.in_proj.weight"]
        sd[h + "conv.out_proj.weight"] = T[p + "shortconv.out_proj.weight"]
        sd[h + "conv.conv.weight"] = T[p + "shortconv.conv.weight"][:, None, :]
sd = {k: torch.tensor(v, dtype=torch.float64) for k, v in sd.items()}
missing, unexpected = m.load_state_dict(sd, strict=False)
print("missing", missing, "unexpected", unexpected)
z = np.load(sys.argv[1] + '.golden.npz')
toks = torch.tensor([z['tokens'].tolist()])
with torch.no_grad():
    out = m(input_ids=toks, use_cache=False).logits[0].numpy()
d = np.abs(out - z['logits'])
print("HF transformers vs llama.cpp: max", d.max(), "mean", d.mean(), "argmax agree", (out.argmax(1) == z['logits'].argmax(1)).mean())
