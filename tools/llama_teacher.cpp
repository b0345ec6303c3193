// llama.cpp teacher forcing for tools/make_goldens.py --llama-teacher: the prompt as one batch,
// then its greedy continuation one token at a time (flash attention off, F16 KV cache, n_ctx 512).
// Build against a llama.cpp build tree (static libraries):
//   g++ -O1 -std=c++17 tools/llama_teacher.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       $BUILD/src/libllama.a $BUILD/ggml/src/libggml*.a -fopenmp -lpthread -ldl -o llama_teacher
// usage: llama_teacher MODEL OUT.bin N_GEN TOKEN... writes int32 n_pos, n_vocab, the tokens, then
// float32 logits (n_pos, n_vocab).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char **argv) {
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    auto cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; cp.n_seq_max = 1;
    llama_context *ctx = llama_init_from_model(m, cp);
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    int n_gen = atoi(argv[3]);
    std::vector<int> toks;
    for (int i = 4; i < argc; i++) toks.push_back(atoi(argv[i]));
    int np = toks.size();
    std::vector<float> logits;
    llama_batch b = llama_batch_init(512, 0, 1);
    b.n_tokens = np;
    for (int i = 0; i < np; i++) { b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
    if (llama_decode(ctx, b)) return 2;
    for (int i = 0; i < np; i++) { float *l = llama_get_logits_ith(ctx, i); logits.insert(logits.end(), l, l + nv); }
    for (int g = 0; g < n_gen; g++) {
        const float *l = &logits[logits.size() - nv];
        int best = 0; for (int j = 1; j < nv; j++) if (l[j] > l[best]) best = j;
        toks.push_back(best);
        b.n_tokens = 1; b.token[0] = best; b.pos[0] = toks.size() - 1; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
        if (llama_decode(ctx, b)) return 3;
        float *o = llama_get_logits_ith(ctx, 0); logits.insert(logits.end(), o, o + nv);
    }
    FILE *f = fopen(argv[2], "wb");
    int hdr[2] = {(int)toks.size(), nv};
    fwrite(hdr, 4, 2, f); fwrite(toks.data(), 4, toks.size(), f); fwrite(logits.data(), 4, logits.size(), f);
    fclose(f);
    return 0;
}
