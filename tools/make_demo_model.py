#!/usr/bin/env python3
"""Write a tiny demo model (random weights, llama architecture, SentencePiece-style vocabulary
with byte fallback, a chat template) so the quick start runs without downloads.

    tools/make_demo_model.py OUT.gguf

Its replies are random text: it shows the plumbing (signing, loading, the daemon, streaming),
not a language model. Needs the PyPI `gguf` package (a test extra).
"""
import sys

import numpy as np

WORDS = ("the a and to of in is it was you that he she they we I on for with as at by this be "
         "have not are but from or one all there when up out so what can said will time day "
         "little big cat dog sun tree happy play home friend story once upon hello edge device "
         "model signed socket reply").split()
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def main(out):
    import gguf

    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(6)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + w for w in WORDS]
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i))
        types.append(1)
    n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer = len(tokens), 64, 128, 4, 2, 2
    head_dim = n_embd // n_head
    rng = np.random.default_rng(20261130)

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    g = gguf.GGUFWriter(out, "llama")
    g.add_name("edged-demo")
    g.add_context_length(512)
    g.add_embedding_length(n_embd)
    g.add_feed_forward_length(n_ff)
    g.add_block_count(n_layer)
    g.add_head_count(n_head)
    g.add_head_count_kv(n_head_kv)
    g.add_rope_dimension_count(head_dim)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_rope_freq_base(10000.0)
    g.add_vocab_size(n_vocab)
    g.add_tokenizer_model("llama")
    g.add_token_list(tokens)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_unk_token_id(0)
    g.add_add_bos_token(True)
    g.add_add_eos_token(False)
    g.add_chat_template(TEMPLATE)
    g.add_tensor("token_embd.weight", w(n_vocab, n_embd, scale=0.5))
    for i in range(n_layer):
        g.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        g.add_tensor(f"blk.{i}.attn_q.weight", w(n_embd, n_embd))
        g.add_tensor(f"blk.{i}.attn_k.weight", w(n_head_kv * head_dim, n_embd))
        g.add_tensor(f"blk.{i}.attn_v.weight", w(n_head_kv * head_dim, n_embd))
        g.add_tensor(f"blk.{i}.attn_output.weight", w(n_embd, n_embd))
        g.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        g.add_tensor(f"blk.{i}.ffn_gate.weight", w(n_ff, n_embd))
        g.add_tensor(f"blk.{i}.ffn_up.weight", w(n_ff, n_embd))
        g.add_tensor(f"blk.{i}.ffn_down.weight", w(n_embd, n_ff))
    g.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    out = w(n_vocab, n_embd, scale=0.5)
    out[:3 + 256] = 0.0           # control and byte tokens get logit 0: the random reply is words
    g.add_tensor("output.weight", out)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
