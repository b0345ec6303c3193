// llama.cpp's libmtmd as the oracle of tools/make_vision_goldens.py: one image (raw RGB bytes)
// encoded by an mmproj file (flash attention off), then a prompt holding it evaluated by the
// text model (mtmd_helper_eval_chunks: the image's rows decoded as llama.cpp does, e.g.
// non-causally for gemma3) and the logits after the last token.
// Build against a llama.cpp build tree with tools/mtmd/libmtmd.a (static libraries):
//   g++ -O1 -std=c++17 tools/mtmd_teacher.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -I$LLAMA/tools/mtmd $BUILD/tools/mtmd/libmtmd.a $BUILD/src/libllama.a \
//       $BUILD/ggml/src/libggml*.a -fopenmp -lpthread -ldl -o mtmd_teacher
// usage: mtmd_teacher MMPROJ MODEL IMAGE.rgb WIDTH HEIGHT OUT.bin PROMPT
//   PROMPT holds mtmd's default marker <__media__> once. OUT.bin: int32 n_img_tokens, n_embd,
//   n_prompt, n_vocab; float32 image embeddings (n_img_tokens, n_embd); int32 prompt token ids
//   (-1 at the image's rows); float32 logits after the last prompt token (n_vocab; zeros when
//   the text model lacks a token the projector's layout needs: embeddings only).
// Timing (tools/bench_vision.py): MTMD_THREADS=N threads (default 2), MTMD_REPEAT=R encodes
//   the image R more times after the first and prints "encode_ms <median>" (all chunks of the
//   image, preprocessing included as mtmd_encode_chunk does it) to stderr; MTMD_FLASH=1 leaves
//   flash attention at mtmd's default (auto) instead of off. A timing run evaluates no prompt
//   (its logits are zeros).
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
// mtmd-helper's file/buffer loaders name their bitmaps by a hash from llama.cpp's vendor/hash,
// which the sdist does not ship; the teacher makes its bitmap from raw pixels and never calls them
std::string hash_sha256_hex(const void *, size_t) { return std::string(); }
int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage: mtmd_teacher MMPROJ MODEL IMAGE.rgb W H OUT.bin PROMPT\n"); return 1; }
    const char *env_t = getenv("MTMD_THREADS"), *env_r = getenv("MTMD_REPEAT"), *env_f = getenv("MTMD_FLASH");
    int n_threads = env_t ? atoi(env_t) : 2, repeat = env_r ? atoi(env_r) : 0;
    bool flash = env_f && atoi(env_f);
    llama_backend_init();
    llama_model *m = llama_model_load_from_file(argv[2], llama_model_default_params());
    if (!m) return 2;
    auto cp = llama_context_default_params();
    cp.n_ctx = 1024; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = n_threads; cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; cp.n_seq_max = 1;
    llama_context *lctx = llama_init_from_model(m, cp);
    auto mp = mtmd_context_params_default();
    mp.use_gpu = false; mp.n_threads = n_threads; mp.warmup = false;
    if (!flash) mp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    mtmd_context *ctx = mtmd_init_from_file(argv[1], m, mp);
    if (!ctx) return 3;
    int W = atoi(argv[4]), H = atoi(argv[5]);
    std::vector<unsigned char> px((size_t)W * H * 3);
    FILE *fi = fopen(argv[3], "rb");
    if (!fi || fread(px.data(), 1, px.size(), fi) != px.size()) return 4;
    fclose(fi);
    mtmd_bitmap *bm = mtmd_bitmap_init(W, H, px.data());
    mtmd_input_text text = {argv[7], strlen(argv[7]), true, true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    const mtmd_bitmap *bms[1] = {bm};
    if (mtmd_tokenize(ctx, chunks, &text, bms, 1)) return 5;
    int n_embd = llama_model_n_embd(m), nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    std::vector<int> ids;
    std::vector<float> embd;
    int n_img = 0;  // rows of every image chunk (idefics3: the tiles, then the overview)
    std::vector<double> ms(repeat + 1, 0.0);
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *c = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n; const llama_token *t = mtmd_input_chunk_get_tokens_text(c, &n);
            ids.insert(ids.end(), t, t + n);
        } else {
            int n = mtmd_input_chunk_get_n_tokens(c);
            for (int r = repeat; r >= 0; r--) {    // the last encode (r = 0) is the one kept
                auto t0 = std::chrono::steady_clock::now();
                if (mtmd_encode_chunk(ctx, c)) return 6;
                ms[r] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            }
            float *e = mtmd_get_output_embd(ctx);
            embd.insert(embd.end(), e, e + (size_t)n * n_embd);
            ids.insert(ids.end(), n, -1);
            n_img += n;
        }
    }
    if (repeat > 0) {   // the first encode (ms[repeat]) warms the caches up and is left out
        std::vector<double> t(ms.begin(), ms.begin() + repeat);
        std::sort(t.begin(), t.end());
        fprintf(stderr, "encode_ms %.1f\n", t[t.size() / 2]);
    }
    // a text model without the projector's special tokens (mtmd's lookup_token gives
    // LLAMA_TOKEN_NULL): image embeddings only, logits left zero
    bool usable = repeat == 0;      // timing runs: the encoder only
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *c = mtmd_input_chunks_get(chunks, i);
        size_t n; const llama_token *t = mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT
            ? mtmd_input_chunk_get_tokens_text(c, &n) : nullptr;
        for (size_t j = 0; t && j < n; j++) if (t[j] < 0 || t[j] >= nv) usable = false;
    }
    std::vector<float> zeros(nv, 0.0f);
    float *l = zeros.data();
    llama_pos n_past = 0;
    if (usable) {
        if (mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 512, true, &n_past)) return 7;
        l = llama_get_logits_ith(lctx, -1);
    }
    FILE *f = fopen(argv[6], "wb");
    int hdr[4] = {n_img, n_embd, (int)ids.size(), nv};
    fwrite(hdr, 4, 4, f); fwrite(embd.data(), 4, embd.size(), f);
    fwrite(ids.data(), 4, ids.size(), f); fwrite(l, 4, nv, f);
    fclose(f);
    return 0;
}
