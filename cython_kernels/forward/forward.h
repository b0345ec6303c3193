/* The compiled forward pass: one call runs a batch of tokens through every layer.
 *
 * All threads of the pool (ed_threads.h) execute ed_forward_worker() together; matrix products
 * take chunks of whole row tiles from a shared counter (ed_claim: a thread that is late takes
 * fewer), the small per-token ops split by thread index, and a barrier separates dependent ops
 * (ggml's model). Nothing here allocates: every buffer comes from the session arena (64-byte
 * aligned), weights from the read-only mapping. Matrix products go through ed_matmul(), which
 * quantizes the activations to the weight type's partner format (Q8_0 / Q8_K / F16 / F32) like
 * llama.cpp and multiplies with the type's dot product (ed_type_traits).
 *
 * Shapes follow GGUF: a weight W has ne0 = K (row length, input features) and ne1 = N (rows,
 * output features); activations are row-major (n_tokens, features).
 */
#ifndef EDGED_FORWARD_H
#define EDGED_FORWARD_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "ed_types.h"
#include "ed_simd.h"
#include "ed_parity.h"
#include "ed_quant.h"
#include "ed_threads.h"

typedef struct {
    const uint8_t *data;   /* start of the tensor in the mapping (or repacked copy) */
    int type;              /* ggml type id */
    int64_t ne0, ne1;      /* row length, number of rows */
    size_t row_bytes;
    int layout;            /* ED_LAYOUT_MAPPED, or ED_LAYOUT_R4: repacked at load (ed_repack.h) */
} ed_tensor;

/* A layer's weight tensors by role, one X(name) each: the field of the same name of
 * edged.engine.arch.LayerTensors, set by name at load (ForwardModel.setup); absent ones are zero */
#define ED_LAYER_TENSORS(X) \
    X(attn_norm) X(attn_q) X(attn_k) X(attn_v) X(attn_qkv) X(attn_q_bias) X(attn_k_bias) X(attn_v_bias) \
    X(attn_q_norm) X(attn_k_norm) X(attn_output) X(post_attention_norm) \
    X(ffn_norm) X(ffn_gate) X(ffn_up) X(ffn_down) X(post_ffw_norm) \
    /* MoE: router (ne0 n_embd, ne1 n_expert) and 3-D experts: ne1 is the rows of one expert, \
       expert e starts at row e * ne1 (ffn_down_exps: ne0 n_ff_exp, ne1 n_embd) */ \
    X(ffn_gate_inp) X(ffn_gate_exps) X(ffn_up_exps) X(ffn_down_exps) \
    /* shared expert (qwen2moe): gate (ne0 n_embd, one row), gate/up/down of n_ff_shexp */ \
    X(ffn_gate_inp_shexp) X(ffn_gate_shexp) X(ffn_up_shexp) X(ffn_down_shexp) \
    /* gpt-oss: a sink logit per head (n_head), attn_output's bias (n_embd), the router's bias \
       (n_expert) and per-expert biases: row e of gate/up (ne0 n_ff_exp) and down (ne0 n_embd) */ \
    X(attn_sinks) X(attn_output_bias) \
    X(ffn_gate_inp_bias) X(ffn_gate_exps_bias) X(ffn_up_exps_bias) X(ffn_down_exps_bias) \
    /* a gated short convolution layer (lfm2) instead of attention: in_proj (ne0 n_embd, \
       ne1 3 n_embd: B | C | x), the depthwise kernel (F32, l_cache taps per channel, the \
       current input's last), out_proj (n_embd, n_embd) */ \
    X(shortconv_in_proj) X(shortconv_conv) X(shortconv_out_proj) \
    /* a Gated DeltaNet layer (qwen35; deltanet.h): attn_qkv gives q|k|v before the \
       convolution, attn_gate z, ssm_beta / ssm_alpha (ne1 H_v); vectors ssm_conv1d (F32, \
       d_conv taps per channel), ssm_dt, ssm_a (H_v), ssm_norm (S); ssm_out (ne0 S H_v) */ \
    X(attn_gate) X(ssm_conv1d) X(ssm_dt) X(ssm_a) X(ssm_beta) X(ssm_alpha) X(ssm_norm) X(ssm_out) \
    /* a Mamba-2 layer (granitehybrid; mamba2.h): ssm_in (ne1 d_inner + conv channels + heads: \
       z | xBC | dt), ssm_conv1d and its bias, ssm_dt (the dt bias), ssm_a, ssm_d (n_head), \
       ssm_norm (d_inner), ssm_out (ne0 d_inner) */ \
    X(ssm_in) X(ssm_conv1d_b) X(ssm_d) \
    /* gemma4 (forward_layers.h): per-layer embeddings' gate (ne0 n_embd, ne1 P), projection \
       (ne0 P, ne1 n_embd) and its norm; a scalar (F32, one value) times the layer's output */ \
    X(per_layer_inp_gate) X(per_layer_proj) X(per_layer_post_norm) X(layer_output_scale) \
    /* gemma4 mixture of experts (forward_moe_gemma4.h): gate|up of every expert fused (ne1 \
       2 n_ff_exp), a scale per expert's output (n_expert), the router input's scale (n_embd), \
       the experts' input norm and the output norms of the dense FFN and of the experts */ \
    X(ffn_gate_up_exps) X(ffn_down_exps_scale) X(ffn_gate_inp_scale) \
    X(pre_ffw_norm_2) X(post_ffw_norm_1) X(post_ffw_norm_2) \
    /* gemma3n (gemma3n.h; per-layer inputs as gemma4's): AltUp's router (ne0 n_embd, ne1 \
       n_altup) and its norm, predict (ne0 n_altup, ne1 n_altup^2) and correct (n_altup square) \
       coefficients, correct scale (n_embd); LAuReL's l (ne0 n_embd, ne1 rank), r, post norm */ \
    X(altup_router) X(altup_router_norm) X(altup_predict_coef) X(altup_correct_coef) \
    X(altup_correct_scale) X(laurel_l) X(laurel_r) X(laurel_post_norm)

typedef struct {
#define ED_LT_MEMBER(name) ed_tensor name;
    ED_LAYER_TENSORS(ED_LT_MEMBER)
#undef ED_LT_MEMBER
    int swa;               /* this layer uses the sliding window (and the local RoPE base) */
    int rope;              /* this layer rotates q and k (smollm3: not every fourth) */
    int conv;              /* a convolution layer: 1 + its slot in the convolution cache; 0: attention */
    int recr;              /* a DeltaNet or Mamba-2 (ssm_in set) layer: 1 + its slot in the
                              recurrent state; 0: not */
    /* this layer's sizes: the model's, or its own (gemma4); the scratch is sized by the largest */
    int head_dim, n_head_kv, n_rot, n_ff;
    int kv_src;            /* the layer whose K/V cache it attends over: itself, or an earlier
                              one (gemma4's shared KV layers, which store none) */
    int rope_ff;           /* the model's rope_factors apply to this layer (gemma4: full ones) */
    int kv;                /* an attention layer: 1 + its slot in the K/V cache; 0: none (a
                              convolution or recurrent layer keeps other state) */
    float sparsity;        /* gemma3n: the FFN gate's cut at mean + sparsity * std; 0: none */
} ed_layer;

/* The model's scalar hyperparameters, one X(C type, name) each: the field of the same name of
 * edged.engine.arch.HParams, copied by name at load (forward.pxi, ForwardModel.setup, which
 * fails on a name HParams lacks and on an HParams field that is neither here nor marked as not
 * read by this pass). A new hyperparameter of the forward pass is a row here and its field there. */
#define ED_HPARAMS(X) \
    X(int, n_vocab) X(int, n_embd) X(int, n_ff) X(int, n_layer) X(int, n_head) X(int, n_head_kv) \
    X(int, head_dim) X(int, n_rot) \
    X(int, rope_neox)             /* RoPE rotates halves (NeoX), not adjacent pairs */ \
    X(int, act_gelu)              /* the gate's activation is GELU, not SiLU */ \
    X(int, n_swa)                 /* sliding window (0: none) */ \
    X(int, scale_q)               /* attn_scale multiplies q before attention (gemma3), not q.k */ \
    X(float, rope_freq_base) X(float, rope_freq_scale) \
    X(float, rope_freq_base_swa)  /* local layers' RoPE base */ \
    X(float, rope_attn_factor) X(float, rms_eps) X(float, attn_scale) X(float, embd_scale) \
    X(float, final_logit_softcap) \
    X(float, rope_freq_scale_swa) /* local layers' RoPE scale */ \
    X(float, rope_ext_factor) X(float, yarn_beta_fast) X(float, yarn_beta_slow)  /* YaRN (0: off) */ \
    X(int, n_ctx_orig)            /* YaRN's original context */ \
    X(float, attn_softcap)        /* tanh cap of q.k before the softmax scale, 0: off (gemma2) */ \
    X(float, residual_scale)      /* multiplies attention and FFN outputs (granite; else 1) */ \
    X(float, logit_mul)           /* multiplies the logits (granite: 1 / logit_scale; else 1) */ \
    X(int, n_expert) X(int, n_expert_used) X(int, n_ff_exp)  /* MoE (n_expert 0: dense) */ \
    X(int, expert_weights_norm)   /* the k router weights renormalised to sum 1 */ \
    X(int, n_ff_shexp)            /* shared expert width (0: none) */ \
    X(int, expert_softmax_topk)   /* top k of the router logits, then softmax over those k (gpt-oss) */ \
    X(int, act_oai)               /* gpt-oss's clamped SwiGLU instead of silu/gelu */ \
    X(int, n_shortconv_l_cache)   /* taps of the short convolutions (lfm2; 0: none) */ \
    X(int, n_conv_layers)         /* how many layers are convolutions (slots of the conv cache) */ \
    X(int, ssm_d_conv) X(int, ssm_d_state) X(int, ssm_n_group) X(int, ssm_dt_rank) /* DeltaNet, Mamba-2 */ \
    X(int, ssm_d_inner)           /* a recurrent layer's output width (DeltaNet S * H_v) */ \
    X(int, n_recr_layers)         /* how many layers are recurrent (slots of the recurrent state) */ \
    X(int, attn_gated_q)          /* attn_q gives q | gate per head; output times sigmoid(gate) */ \
    X(int, n_embd_per_layer)      /* per-layer embeddings' width P (gemma4; 0: none) */ \
    X(int, v_norm)                /* V RMS-normed without a weight (gemma4) */ \
    X(int, n_altup)               /* AltUp streams (gemma3n; 0: none) */

typedef struct {
#define ED_HP_MEMBER(T, name) T name;
    ED_HPARAMS(ED_HP_MEMBER)
#undef ED_HP_MEMBER
    ed_tensor token_embd, output_norm, output;
    ed_tensor per_layer_model_proj, per_layer_proj_norm;  /* gemma4's per-layer inputs, or zero */
    ed_tensor altup_proj, altup_unembd_proj;  /* gemma3n: (n_embd, n_embd, n_altup - 1) */
    const float *rope_factors;   /* (n_rot/2) or NULL */
    ed_layer *layers;            /* (n_layer) */
} ed_model;

/* ED_HPARAMS as data, for ForwardModel.setup: name, 1 for float (else int), offset in ed_model */
typedef struct { const char *name; int is_float; size_t offset; } ed_hparam;
#define ED_HP_IS_FLOAT_int 0
#define ED_HP_IS_FLOAT_float 1
#define ED_HP_ROW(T, name) {#name, ED_HP_IS_FLOAT_##T, offsetof(ed_model, name)},
static const ed_hparam ED_HPARAM_LIST[] = {ED_HPARAMS(ED_HP_ROW) {NULL, 0, 0}};
#undef ED_HP_ROW
/* ED_LAYER_TENSORS as data: name, offset in ed_layer */
typedef struct { const char *name; size_t offset; } ed_layer_role;
#define ED_LT_ROW(name) {#name, offsetof(ed_layer, name)},
static const ed_layer_role ED_LAYER_ROLES[] = {ED_LAYER_TENSORS(ED_LT_ROW) {NULL, 0}};
#undef ED_LT_ROW

/* logits rows kept per call: a batch asking for every row's logits is at most this long
   (a 152k vocabulary costs 0.6 MB per row; the prompt itself only needs its last row) */
#define ED_MAX_LOGIT_ROWS 32

/* One session's buffers, carved from one 64-byte aligned arena. */
typedef struct {
    int n_ctx, n_batch;
    int type_k, type_v;  /* cache types: ED_F16 (default), ED_Q8_0 or ED_Q4_0 (ed_kv_type_ok) */
    size_t k_row, v_row; /* bytes of one cache row (one position, n_head_kv * head_dim values);
                            per layer when the layers' sizes differ: ed_layer_row */
    uint8_t *k_cache;    /* (n_layer, n_ctx, k_row) rows of type_k: layer il's (n_ctx, its row)
                            start at n_ctx * kv_off[il] */
    uint8_t *v_cache;    /* (n_layer, n_ctx, v_row) rows of type_v, from n_ctx * kv_off[n_layer + il] */
    size_t *kv_off;      /* (2, n_layer) bytes of one position's K (V) rows of the layers before */
    float *ple;          /* (n_batch, n_layer * P) gemma4's per-layer inputs (forward_layers.h) */
    float *ple_proj;     /* (n_batch, n_layer * P) their projection of the embeddings */
    float *conv_cache;   /* (n_conv_layers, n_ctx, n_embd): a convolution layer's input B * x at
                            each position. Kept per position like a K/V row, so the kernel's
                            window at any position is in the cache and a session rewound to an
                            earlier position (prefix reuse, speculation) needs no state rollback */
    float *x;            /* (n_batch, n_embd) residual stream */
    float *xb;           /* (n_batch, max(n_embd, n_head*head_dim)) normed input / attn out */
    float *xb2;          /* (n_batch, n_embd) projection output */
    float *qkv;          /* (n_batch, q + k + v dims) */
    float *hb;           /* (n_batch, 2 * n_ff) gate|up */
    float *att;          /* (n_threads, att_stride) attention scratch: scores (exact path) or
                            the blocked kernel's work space */
    size_t att_stride;
    uint16_t *qh;        /* (n_threads, head_dim) the current head's query in the K type's dot
                            format (f16, or q8_0 blocks: fewer bytes) */
    float *vacc;         /* (n_threads, 80 * head_dim) lanes of the softmax x V sums + reduction */
    uint8_t *xq;         /* (max(n_batch, n_threads), quantized row of max(n_embd, n_ff, q dims)) */
    size_t xq_row;       /* bytes per quantized activation row */
    uint8_t *gemm;       /* (n_threads, gemm_bytes) packed-panel scratch (ed_gemm.h) */
    size_t gemm_bytes;
    ed_ginfo *xinfo;     /* (n_batch, xinfo_row) group sums of the quantized activations */
    float *xdy;          /* (ed_gemm_dy_len(n_batch, max K)) their block scales for R4 panels */
    size_t xinfo_row;
    float *logits;       /* (n_batch, n_vocab) */
    int32_t *tokens;     /* (n_batch) */
    /* MoE scratch (NULL for a dense model) */
    float *probs;        /* (n_batch, n_expert) router softmax */
    int32_t *sel;        /* (n_batch, n_expert_used) chosen experts, best first */
    float *selw;         /* (n_batch, n_expert_used) their weights */
    int32_t *order;      /* (n_batch * n_expert_used) t * k + slot, grouped by expert */
    int32_t *where;      /* (n_batch * n_expert_used) index into order of t * k + slot */
    int32_t *eoff;       /* (n_expert + 1) start of each expert's group in order */
    float *xe;           /* (n_batch, n_embd) one expert's gathered input rows */
    float *ye;           /* (n_batch * n_expert_used, n_embd) expert outputs, grouped */
    /* per-call arguments */
    int n_tokens, pos;
    int n_out;           /* rows whose logits are computed: out_rows[0..n_out) */
    int32_t *out_rows;   /* (ED_MAX_LOGIT_ROWS) batch rows, ascending; logits row i is out_rows[i] */
    int all_rows;        /* every row's final residual is wanted (hidden states, embeddings): the
                            last layer runs all rows, not only out_rows (ed_last_rows) */
    atomic_int attn_next;  /* next attention block to take (ed_attention) */
    /* rows at positions nc_lo..nc_hi of an ordinary batch attend to every key up to nc_hi, not
       only the earlier ones: an image's rows, which llama.cpp decodes non-causally (gemma3).
       nc_hi < nc_lo (the default, -1 / 0): every row is causal. Set by the caller per call. */
    int nc_lo, nc_hi;
    /* a batch over several sessions (ed_forward_rows): row t is a token at position
       row_pos[t] with the KV cache of another state (row_k/row_v/row_nctx): the decode tokens
       of some sessions and prompt chunks of others; this state only lends its scratch. 0 for
       an ordinary batch of this session's own tokens. */
    int batched;
    int32_t *row_pos, *row_nctx;   /* (n_batch) */
    uint8_t **row_k, **row_v;      /* (n_batch) */
    float **row_c;                 /* (n_batch) their convolution caches */
    float **row_r;                 /* (n_batch) their recurrent states */
    float *rstate;       /* (recurrent state floats) the recurrent layers' live state (deltanet.h) */
    float *gate;         /* (n_batch, n_head * head_dim) gated attention's gates (qwen35) */
    float *alt;          /* (n_batch, n_altup, n_embd) gemma3n's AltUp streams (gemma3n.h) */
    float *laurel;       /* (n_batch, n_embd) its LAuReL rows */
    float *altc;         /* (n_batch, n_altup * (n_altup + 1)) its router outputs, coefficients */
    const ed_model *m;
    struct ed_pool *pool;
    /* profiling: nanoseconds per op kind, summed by thread 0 */
    int profile;
    double prof_ns[ED_PROF_N];     /* by op kind */
    double prof_mm[ED_NTYPES];     /* matrix products (with their activation quantization) by weight type */
} ed_state;

/* ---------------------------------------------------------------- small ops ------------ */
static inline void ed_range(int64_t n, int ith, int nth, int64_t *a, int64_t *b) {
    int64_t per = (n + nth - 1) / nth;
    *a = per * ith; if (*a > n) *a = n;
    *b = *a + per; if (*b > n) *b = n;
}

static inline const float *ed_vec(const ed_tensor *t) { return (const float *)t->data; }

/* out = x / rms(x) * w (w may be NULL) over rows of length n; like ggml: squares in float,
   summed in double. */
static void ed_rms_norm(float *out, const float *x, const float *w, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    if (w) for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
    else   for (int i = 0; i < n; i++) out[i] = x[i] * scale;
}

/* RoPE with YaRN as ggml computes it (ggml_rope_yarn_corr_dims, rope_yarn): each pair mixes
 * the interpolated angle (freq_scale * theta) with the extrapolated one by a ramp over the
 * dims between the beta_fast and beta_slow corrections; ext_factor 0 is plain scaled RoPE. */
static float ed_yarn_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
    return n_rot * logf(n_ctx_orig / (beta * 2 * (float)3.14159265358979323846)) / (2 * logf(base));
}

static void ed_rope_ext(float *x, int n_heads, int head_dim, int n_rot, int pos, float base,
                        float freq_scale, const float *ff, float mscale, int neox,
                        float ext_factor, int n_ctx_orig, float beta_fast, float beta_slow) {
    const float theta_scale = powf(base, -2.0f / n_rot);
    float cs[2 * 512];  /* n_rot <= 1024 checked at setup */
    float theta = (float)pos, lo = 0.0f, hi = 0.0f;
    if (ext_factor != 0.0f) {
        lo = floorf(ed_yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, base));
        hi = ceilf(ed_yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, base));
        lo = lo > 0.0f ? lo : 0.0f;
        hi = hi < n_rot - 1 ? hi : (float)(n_rot - 1);
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    }
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
        const float te = ff ? theta / ff[i0 / 2] : theta;
        float t = freq_scale * te;
        if (ext_factor != 0.0f) {
            const float y = (i0 / 2 - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
            const float mix = (1 - (y < 0 ? 0 : y > 1 ? 1 : y)) * ext_factor;
            t = t * (1 - mix) + te * mix;
        }
        cs[i0] = cosf(t) * mscale;
        cs[i0 + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        if (neox) {
            int half = n_rot / 2;
            for (int i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1];
                float a = v[i], b = v[i + half];
                v[i] = ed_pm_rot0(a, b, c, s);
                v[i + half] = ed_pm_rot1(a, b, c, s);
            }
        } else {
            for (int i = 0; i < n_rot; i += 2) {
                float c = cs[i], s = cs[i + 1];
                float a = v[i], b = v[i + 1];
                v[i] = ed_pm_rot0(a, b, c, s);
                v[i + 1] = ed_pm_rot1(a, b, c, s);
            }
        }
    }
}

static void ed_rope(float *x, int n_heads, int head_dim, int n_rot, int pos, float base,
                    float freq_scale, const float *ff, float mscale, int neox) {
    ed_rope_ext(x, n_heads, head_dim, n_rot, pos, base, freq_scale, ff, mscale, neox, 0.0f, 0, 0.0f, 0.0f);
}

/* the activations as llama.cpp computes them (ed_parity.h) */
static inline float ed_gelu(float x) { return ed_pm_gelu(x); }

static inline float ed_silu(float x) { return ed_pm_silu(x); }


/* ---------------------------------------------------------------- matmul --------------- */
#define ED_ROW_TILE 16

/* out[t*ldo + r] = W[r] . x[t*ldx] for t < n, r < W->ne1. All threads call it. When reuse
 * is set, the activations were quantized for this very x and type by the previous call. */
/* A batch of n tokens in activation format vt goes through the packed panels (ed_gemm.h), a
 * few tokens through the tiles; a batch of one session's prompt or of several sessions' rows
 * alike. Every kernel sums a weight row in the one canonical order (ed_types.h), so the choice
 * changes the speed, not the bits. */
static inline int ed_gemm_wanted(const ed_state *s, int n, int vt) {
    return n > 1 && n >= ed_gemm_min_cols() && ED_GEMM_KERNEL && s->gemm_bytes &&
           (vt == ED_Q8_0 || vt == ED_Q8_1 || vt == ED_Q8_K);
}

/* What the packed panels of W read besides the quantized activations: their group sums
 * (ed_gemm_info), or for a repacked W with a panel kernel of its own (NEON dotprod's R4: the block
 * sums are exact integers there) the block scales as floats (ed_gemm_dy_r4). A mask: a batch
 * quantized once for several matrices computes what any of them reads. */
enum { ED_READS_INFO = 1, ED_READS_DY = 2 };
static inline int ed_reads_info(const ed_tensor *W) {
    if (!ed_gemm_ok(W->type)) return 0;
    return ed_gemm_reads_dy(W->type, W->layout) ? ED_READS_DY : ED_READS_INFO;
}

/* Quantize the activation rows x (n, K) into the format weights of `type` need. For one
 * token every thread quantizes the row into its own slot (no barrier); for a batch the rows
 * are split and a barrier follows, with what the panels of its consumers read (reads: ed_reads_info).
 * Returns the base and stride of this thread's view. */
static const uint8_t *ed_quantize_act(ed_state *s, ed_pool *p, int type, int K, const float *x,
                                      int ldx, int n, int reads, int ith, int nth, size_t *rb_out) {
    const size_t rb = ed_act_row_bytes(type, K);
    const ed_quant_fn q = ED_QUANT[ED_TRAITS[type].vec_type];
    *rb_out = rb;
    if (n == 1) {
        uint8_t *mine = s->xq + (size_t)ith * s->xq_row;
        q(x, mine, K);
        return mine;
    }
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) q(x + t * ldx, s->xq + t * rb, K);
    if (ed_gemm_wanted(s, n, ED_TRAITS[type].vec_type))  /* for the packed panels (ed_rows) */
        for (int64_t t = a; t < b; t++) {
            if (reads & ED_READS_INFO)
                ed_gemm_info(ED_TRAITS[type].vec_type, K, s->xq + t * rb, s->xinfo + t * s->xinfo_row);
            if (reads & ED_READS_DY) ed_gemm_dy_r4(K, s->xq + t * rb, (int)t, s->xdy);
        }
    ed_barrier(p);
    return s->xq;
}

/* out[t*ldo + r] = W[r] . x[t] for rows r in [r0, r1) of W, all n tokens: the packed panels
 * for a batch, else tiles of rows that stay in cache, each read from memory once for all n. */
static inline void ed_rows(const ed_state *s, const ed_tensor *W, int64_t r0, int64_t r1,
                           const uint8_t *xq, size_t rb, int n, float *out, int ldo, int ith) {
    if (r1 > r0 && ed_gemm_wanted(s, n, ED_TRAITS[W->type].vec_type) && ed_gemm_ok(W->type)) {
        /* a prompt batch: packed panels */
        ed_gemm_rows_layout(W->type, W->layout, (int)W->ne0, W->data + r0 * W->row_bytes, W->row_bytes,
                            (int)(r1 - r0), xq, rb, s->xinfo, s->xinfo_row, s->xdy, n, out + r0, (size_t)ldo,
                            s->gemm + (size_t)ith * s->gemm_bytes);
        return;
    }
    /* one token or a decode batch: the whole chunk in one call (each row is read once anyway, and
       the row kernels form their per-column work once per call; the R4 kernels walk their 4-row
       groups themselves); more tokens without panels: tiles of rows that stay in cache, each
       weight row decoded once per group of ED_MAX_COLS tokens (ed_simd.h). A repacked matrix's
       groups of ED_R4_ROWS rows sit where their rows would (r0: a multiple of ED_ROW_TILE). */
    const int64_t step = n <= ED_MAX_COLS ? r1 - r0 : ED_ROW_TILE;
    for (; r0 < r1; r0 += step) {
        const int64_t e = r0 + step < r1 ? r0 + step : r1;
        if (W->layout == ED_LAYOUT_R4)
            ed_mdot_rows_r4(W->type, (int)W->ne0, W->data + r0 * W->row_bytes, W->row_bytes,
                            (int)(e - r0), xq, rb, n, out + r0, (size_t)ldo);
        else
            ed_mdot_rows(W->type, (int)W->ne0, W->data + r0 * W->row_bytes, W->row_bytes,
                         (int)(e - r0), xq, rb, n, out + r0, (size_t)ldo);
    }
}

/* Rows per chunk of a product with N rows: whole ED_ROW_TILE tiles (so the tiles, and every
 * row's sums, are those of one thread doing all rows: results do not depend on who claims
 * what), about 8 chunks per pool thread so a late thread's share is taken by the others. */
static inline int64_t ed_chunk_rows(const ed_pool *p, int64_t N) {
    const int64_t per = (N + 8 * p->n_threads - 1) / (8 * p->n_threads);
    return (per + ED_ROW_TILE - 1) / ED_ROW_TILE * ED_ROW_TILE;
}

/* out[t*ldo + r] = W[r] . x[t] for t < n, r < W->ne1; all threads call it; ends in a barrier.
 * With reuse the previous call quantized this very x for the same activation format. */
static void ed_matmul(ed_state *s, ed_pool *p, float *out, int ldo, const ed_tensor *W,
                      const float *x, int ldx, int n, int reuse, int ith, int nth) {
    size_t rb;
    const uint8_t *xq;
    if (reuse) {
        rb = ed_act_row_bytes(W->type, (int)W->ne0);
        xq = n == 1 ? s->xq + (size_t)ith * s->xq_row : s->xq;
    } else {
        xq = ed_quantize_act(s, p, W->type, (int)W->ne0, x, ldx, n, ed_reads_info(W), ith, nth, &rb);
    }
    const int64_t N = W->ne1, cr = ed_chunk_rows(p, N);
    for (int64_t c; (c = ed_claim(p, (N + cr - 1) / cr)) >= 0;)
        ed_rows(s, W, c * cr, (c + 1) * cr < N ? (c + 1) * cr : N, xq, rb, n, out, ldo, ith);
    ed_barrier(p);
}

/* Several matrices over the same input (q|k|v): one quantization, one row split over all
 * their rows, one barrier. The matrices must share the activation format. */
static int ed_same_act(const ed_tensor *a, const ed_tensor *b) {
    return ED_TRAITS[a->type].vec_type == ED_TRAITS[b->type].vec_type;
}

static void ed_matmul3(ed_state *s, ed_pool *p, const ed_tensor *W[3], float *out[3], int ldo,
                       const float *x, int ldx, int n, int ith, int nth) {
    size_t rb;
    const int info = ed_reads_info(W[0]) | ed_reads_info(W[1]) | ed_reads_info(W[2]);
    const uint8_t *xq = ed_quantize_act(s, p, W[0]->type, (int)W[0]->ne0, x, ldx, n, info, ith, nth, &rb);
    const int64_t cr = ed_chunk_rows(p, W[0]->ne1 + W[1]->ne1 + W[2]->ne1);
    int64_t nc[3], total = 0;
    for (int i = 0; i < 3; i++) total += nc[i] = (W[i]->ne1 + cr - 1) / cr;
    for (int64_t c; (c = ed_claim(p, total)) >= 0;) {
        int i = 0;
        while (c >= nc[i]) c -= nc[i++];  /* chunk c of matrix i */
        const int64_t r0 = c * cr, r1 = r0 + cr < W[i]->ne1 ? r0 + cr : W[i]->ne1;
        ed_rows(s, W[i], r0, r1, xq, rb, n, out[i], ldo, ith);
    }
    ed_barrier(p);
}

/* The gated FFN's first half without a barrier between the product and the activation:
 * each thread computes the same row range [a, b) of gate and up, then act(gate) * up there.
 * hb (n, 2*n_ff): gate in [0, n_ff), up in [n_ff, 2*n_ff). gate == NULL: fused gate+up
 * matrix (phi3), rows [0, n_ff) gate and [n_ff, 2*n_ff) up. */
/* gpt-oss's SwiGLU as ggml_swiglu_oai computes it, after the expert's biases were added */
#define ED_SWIGLU_OAI_ALPHA 1.702f
#define ED_SWIGLU_OAI_LIMIT 7.0f
static inline float ed_swiglu_oai(float g, float u) {
    const float x = g < ED_SWIGLU_OAI_LIMIT ? g : ED_SWIGLU_OAI_LIMIT;
    const float y = u < -ED_SWIGLU_OAI_LIMIT ? -ED_SWIGLU_OAI_LIMIT
                  : u > ED_SWIGLU_OAI_LIMIT ? ED_SWIGLU_OAI_LIMIT : u;
    const float glu = x / (1.0f + expf(ED_SWIGLU_OAI_ALPHA * (-x)));
    return glu * (y + 1.0f);
}

/* gb/ub: biases of the gate and up rows (gpt-oss experts) or NULL */
static void ed_gate_act(const ed_model *m, float *hb, int F, int n, int64_t a, int64_t b,
                        const float *gb, const float *ub) {
    for (int t = 0; t < n; t++) {
        float *g = hb + (size_t)t * 2 * F, *u = g + F;
        if (gb) for (int64_t i = a; i < b; i++) { u[i] += ub[i]; g[i] += gb[i]; }
        if (m->act_oai) for (int64_t i = a; i < b; i++) g[i] = ed_swiglu_oai(g[i], u[i]);
        else if (m->act_gelu) for (int64_t i = a; i < b; i++) g[i] = ed_gelu(g[i]) * u[i];
        else             ed_pm_silu_mul(ED_PM, (int)(b - a), g + a, u + a);
    }
}

/* act(x G) * (x U) for n rows x (n, n_embd) into hb (n, 2F); U's up rows start at uofs
   (the dense FFN and each expert of a MoE layer) */
static void ed_gate_up(ed_state *s, ed_pool *p, const ed_model *m, const ed_tensor *G,
                       const ed_tensor *U, int64_t uofs, int F, const float *x, int n,
                       const float *gb, const float *ub, int ith, int nth) {
    const int E = m->n_embd;
    float *hb = s->hb;
    const int64_t cr = ed_chunk_rows(p, F), nc = (F + cr - 1) / cr;
    size_t rb;
    const uint8_t *xq;
    if (ed_same_act(G, U)) {
        xq = ed_quantize_act(s, p, G->type, E, x, E, n, ed_reads_info(G) | ed_reads_info(U), ith, nth, &rb);
        for (int64_t c; (c = ed_claim(p, nc)) >= 0;) {
            const int64_t a = c * cr, b = a + cr < F ? a + cr : F;
            ed_rows(s, G, a, b, xq, rb, n, hb, 2 * F, ith);
            ed_rows(s, U, uofs + a, uofs + b, xq, rb, n, hb + F - uofs, 2 * F, ith);
            ed_gate_act(m, hb, F, n, a, b, gb, ub);
        }
    } else {  /* different activation formats (mixed quantizations): one after the other */
        xq = ed_quantize_act(s, p, U->type, E, x, E, n, ed_reads_info(U), ith, nth, &rb);
        for (int64_t c; (c = ed_claim(p, nc)) >= 0;) {
            const int64_t a = c * cr, b = a + cr < F ? a + cr : F;
            ed_rows(s, U, uofs + a, uofs + b, xq, rb, n, hb + F - uofs, 2 * F, ith);
        }
        ed_barrier(p);
        xq = ed_quantize_act(s, p, G->type, E, x, E, n, ed_reads_info(G), ith, nth, &rb);
        for (int64_t c; (c = ed_claim(p, nc)) >= 0;) {
            const int64_t a = c * cr, b = a + cr < F ? a + cr : F;
            ed_rows(s, G, a, b, xq, rb, n, hb, 2 * F, ith);
            ed_gate_act(m, hb, F, n, a, b, gb, ub);
        }
    }
    ed_barrier(p);
}

static void ed_ffn_gate_up(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                           int n, int ith, int nth) {
    const int64_t uofs = L->ffn_gate.data ? 0 : L->n_ff;  /* up rows inside U */
    ed_gate_up(s, p, m, L->ffn_gate.data ? &L->ffn_gate : &L->ffn_up, &L->ffn_up, uofs, L->n_ff,
               s->xb, n, NULL, NULL, ith, nth);
}

/* ---------------------------------------------------------------- mixture of experts ---- */
#define ED_MAX_EXPERT 512

/* ggml_soft_max of one row in place: ggml's expf, the sum in double */
static void ed_softmax_row(const ed_pm_fns *pm, int n, float *x) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) if (x[i] > mx) mx = x[i];
    ed_pm_expf_sub(pm, n, x, mx, x);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += x[i];
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* Expert e of a 3-D *_exps tensor as a 2-D one: its rows are e * ne1 .. (e + 1) * ne1 - 1
   of the mapping, so only the selected experts' pages are ever touched. */
static inline ed_tensor ed_expert(const ed_tensor *W, int e) {
    ed_tensor t = *W;
    t.data = W->data + (size_t)e * (size_t)W->ne1 * W->row_bytes;
    return t;
}

/* The routed FFN as llama.cpp's build_moe_ffn (softmax gating): router logits of xr (n,
 * n_embd), softmax over the experts, the top k (best first), optionally their weights
 * renormalised to sum 1; each selected expert's act(gate) * up of xb then down (times the
 * expert's scale, gemma4); the k outputs times their weights summed in slot order. Tokens are
 * grouped by expert, so each selected expert's weights are read once per batch (llama.cpp's
 * mul_mat_id) and one token reads only its k experts. Output in xb2. */
static void ed_moe_ffn(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                       const float *xr, int n, int ith, int nth) {
    const int E = m->n_embd, X = m->n_expert, k = m->n_expert_used, Fe = m->n_ff_exp;
    const ed_pm_fns pm = *ED_PM;  /* the path's (ed_parity.h), copied once for the loops */
    int64_t a, b;
    ed_matmul(s, p, s->probs, X, &L->ffn_gate_inp, xr, E, n, 0, ith, nth);
    ed_range(n, ith, nth, &a, &b);
    const float *rb = L->ffn_gate_inp_bias.data ? ed_vec(&L->ffn_gate_inp_bias) : NULL;
    for (int64_t t = a; t < b; t++) {
        float *pr = s->probs + t * X;
        if (rb) for (int i = 0; i < X; i++) pr[i] += rb[i];
        if (!m->expert_softmax_topk) ed_softmax_row(&pm, X, pr);
        int32_t *sel = s->sel + t * k;
        float *w = s->selw + t * k;
        for (int j = 0; j < k; j++) {             /* top k, the lower id first on ties */
            int best = -1;
            for (int i = 0; i < X; i++) {
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= sel[q] == i;
                if (!taken && (best < 0 || pr[i] > pr[best])) best = i;
            }
            sel[j] = best;
            w[j] = pr[best];
        }
        if (m->expert_softmax_topk) ed_softmax_row(&pm, k, w);  /* gpt-oss: over the k logits */
        if (m->expert_weights_norm) {
            double ws = 0.0;
            for (int j = 0; j < k; j++) ws += w[j];
            float wsum = (float)ws;
            if (wsum < 6.103515625e-5f) wsum = 6.103515625e-5f;
            for (int j = 0; j < k; j++) w[j] = w[j] / wsum;
        }
    }
    ed_barrier(p);
    if (ith == 0) {  /* (token, slot) pairs grouped by expert: a counting sort */
        int cur[ED_MAX_EXPERT + 1];
        memset(cur, 0, sizeof(int) * (X + 1));
        for (int i = 0; i < n * k; i++) cur[s->sel[i] + 1]++;
        for (int e = 0; e < X; e++) cur[e + 1] += cur[e];
        memcpy(s->eoff, cur, sizeof(int32_t) * (X + 1));
        for (int i = 0; i < n * k; i++) {
            const int at = cur[s->sel[i]]++;
            s->order[at] = i;
            s->where[i] = at;
        }
    }
    ed_barrier(p);
    for (int e = 0; e < X; e++) {
        const int c0 = s->eoff[e], cnt = s->eoff[e + 1] - c0;
        if (cnt == 0) continue;  /* not routed to: its weights are not read */
        const float *xin = s->xb;
        if (n > 1) {  /* gather the expert's tokens */
            ed_range(cnt, ith, nth, &a, &b);
            for (int64_t i = a; i < b; i++)
                memcpy(s->xe + i * E, s->xb + (size_t)(s->order[c0 + i] / k) * E, sizeof(float) * E);
            ed_barrier(p);
            xin = s->xe;
        }
        const int fused = L->ffn_gate_up_exps.data != NULL;  /* gemma4: gate rows, then up */
        const ed_tensor G = ed_expert(fused ? &L->ffn_gate_up_exps : &L->ffn_gate_exps, e);
        const ed_tensor U = fused ? G : ed_expert(&L->ffn_up_exps, e);
        const ed_tensor D = ed_expert(&L->ffn_down_exps, e);
        const float *gb = NULL, *ub = NULL;  /* gpt-oss: the expert's own bias rows */
        if (L->ffn_gate_exps_bias.data) {
            gb = ed_vec(&L->ffn_gate_exps_bias) + (size_t)e * Fe;
            ub = ed_vec(&L->ffn_up_exps_bias) + (size_t)e * Fe;
        }
        ed_gate_up(s, p, m, &G, &U, fused ? Fe : 0, Fe, xin, cnt, gb, ub, ith, nth);
        ed_matmul(s, p, s->ye + (size_t)c0 * E, E, &D, s->hb, 2 * Fe, cnt, 0, ith, nth);
    }
    ed_range(n, ith, nth, &a, &b);
    const float *db = L->ffn_down_exps_bias.data ? ed_vec(&L->ffn_down_exps_bias) : NULL;
    const float *ds = L->ffn_down_exps_scale.data ? ed_vec(&L->ffn_down_exps_scale) : NULL;
    for (int64_t t = a; t < b; t++) {  /* llama.cpp: weighted outputs added in slot order */
        float *o = s->xb2 + t * E;
        const float *w = s->selw + t * k;
        for (int j = 0; j < k; j++) {
            float *y = s->ye + (size_t)s->where[t * k + j] * E;
            if (db) {  /* gpt-oss: the expert's down bias, before its weight */
                const float *bias = db + (size_t)s->sel[t * k + j] * E;
                for (int i = 0; i < E; i++) y[i] += bias[i];
            }
            if (ds) {  /* gemma4: the expert's output scale, before its weight */
                const float sc = ds[s->sel[t * k + j]];
                for (int i = 0; i < E; i++) y[i] *= sc;
            }
            if (j == 0) for (int i = 0; i < E; i++) o[i] = y[i] * w[0];
            else        for (int i = 0; i < E; i++) o[i] = o[i] + y[i] * w[j];
        }
    }
    ed_barrier(p);
    if (L->ffn_up_shexp.data) {
        /* the shared expert for every token, times sigmoid(x . gate_inp_shexp) computed as
           llama.cpp does: silu(g) / g (granitehybrid: no gate); added after the routed experts */
        const int Fs = m->n_ff_shexp, gated = L->ffn_gate_inp_shexp.data != NULL;
        if (gated) ed_matmul(s, p, s->probs, X, &L->ffn_gate_inp_shexp, s->xb, E, n, 0, ith, nth);
        ed_gate_up(s, p, m, &L->ffn_gate_shexp, &L->ffn_up_shexp, 0, Fs, s->xb, n, NULL, NULL, ith, nth);
        ed_matmul(s, p, s->ye, E, &L->ffn_down_shexp, s->hb, 2 * Fs, n, 0, ith, nth);
        ed_range(n, ith, nth, &a, &b);
        for (int64_t t = a; t < b; t++) {
            float *o = s->xb2 + t * E;
            const float *y = s->ye + (size_t)t * E;
            if (!gated) { for (int i = 0; i < E; i++) o[i] = o[i] + y[i]; continue; }
            const float g = s->probs[t * X];  /* at g = 0 silu(g) / g is 0 / 0: sigmoid(0) */
            const float gate = g == 0.0f ? 0.5f : ed_silu(g) / g;
            for (int i = 0; i < E; i++) o[i] = o[i] + y[i] * gate;
        }
        ed_barrier(p);
    }
}


/* Layers holding K/V rows: the attention layers (ed_layer.kv), not the convolution or DeltaNet ones. */
static inline int ed_n_kv_layers(const ed_model *m) {
    return m->n_layer - m->n_conv_layers - m->n_recr_layers;
}

/* Position of batch row t, and the start of layer il in the K (kv 0) or V (kv 1) cache it uses. */
static inline int ed_row_pos(const ed_state *s, int64_t t) {
    return s->batched ? s->row_pos[t] : s->pos + (int)t;
}

/* The last key row t attends to: its own position, or the end of a non-causal span it is in. */
static inline int ed_row_hi(const ed_state *s, int pt) {
    return !s->batched && pt >= s->nc_lo && pt <= s->nc_hi ? s->nc_hi : pt;
}

static inline uint8_t *ed_layer_cache(const ed_state *s, int kv, int64_t t, int il) {
    const size_t off = s->kv_off[kv * s->m->n_layer + s->m->layers[il].kv_src];
    if (s->batched)
        return (kv ? s->row_v[t] : s->row_k[t]) + off * s->row_nctx[t];
    return (kv ? s->v_cache : s->k_cache) + off * s->n_ctx;
}

/* The convolution cache of layer L that batch row t uses: (n_ctx, n_embd) floats. */
static inline float *ed_conv_cache(const ed_state *s, const ed_layer *L, int64_t t, int E) {
    const size_t slot = (size_t)(L->conv - 1);
    if (s->batched) return s->row_c[t] + slot * (size_t)s->row_nctx[t] * E;
    return s->conv_cache + slot * (size_t)s->n_ctx * E;
}

/* A gated short convolution block (lfm2) as llama.cpp's build_shortconv_block computes it:
 * in_proj gives B | C | x per token; B * x is stored at the token's position in the layer's
 * convolution cache; then per channel c the causal depthwise convolution over the l_cache
 * inputs ending at the token (ggml_ssm_conv: taps oldest first, summed in float from 0; inputs
 * before position 0 are zero), times C. Output (n, n_embd) in xb. Ends in a barrier. */
static void ed_shortconv(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int n,
                         int64_t a, int64_t b, int ith, int nth) {
    const int E = m->n_embd, taps = m->n_shortconv_l_cache;
    ed_matmul(s, p, s->qkv, 3 * E, &L->shortconv_in_proj, s->xb, E, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++) {
        const float *bcx = s->qkv + (size_t)t * 3 * E;
        float *row = ed_conv_cache(s, L, t, E) + (size_t)ed_row_pos(s, t) * E;
        for (int i = 0; i < E; i++) row[i] = bcx[i] * bcx[2 * E + i];
    }
    ed_barrier(p);  /* every row of the batch stored: a token's window may hold its neighbours' */
    const float *w = ed_vec(&L->shortconv_conv);
    for (int64_t t = a; t < b; t++) {
        const int pt = ed_row_pos(s, t);
        const float *cache = ed_conv_cache(s, L, t, E), *C = s->qkv + (size_t)t * 3 * E + E;
        float *out = s->xb + (size_t)t * E;
        for (int c = 0; c < E; c++) {
            const float *wc = w + (size_t)c * taps;
            float sum = 0.0f;
            for (int k = 0; k < taps; k++) {
                const int j = pt - (taps - 1) + k;
                sum += (j >= 0 ? cache[(size_t)j * E + c] : 0.0f) * wc[k];
            }
            out[c] = C[c] * sum;
        }
    }
    ed_barrier(p);
}

#include "deltanet.h"
#include "mamba2.h"

/* ---------------------------------------------------------------- the KV cache types --- */
/* As llama.cpp's --cache-type-k/-v: a cache row (one position, all KV heads) is stored as a
 * row of the type, so a q8_0/q4_0 block of 32 never straddles two heads (head_dim % 32 == 0,
 * checked at setup). A row is written once, when its token is evaluated, and every later read
 * (one token, a prompt, a decode batch) sees those stored values. */
static inline int ed_kv_type_ok(int type) {
    return type == ED_F16 || type == ED_Q8_0 || type == ED_Q4_0;
}

/* bytes of n values of a cache type (n a multiple of its block) */
static inline size_t ed_kv_bytes(int type, int64_t n) {
    return (size_t)(n / ED_TRAITS[type].block) * ED_TRAITS[type].type_size;
}

/* Store one row of n values: f16 by conversion; q8_0 with the path's quantize_row_q8_0 and
 * q4_0 with the reference quantizer, the from_float llama.cpp's set_rows uses for each. */
static inline void ed_kv_store(int type, const float *x, uint8_t *dst, int n) {
    if (type == ED_F16) {
        ed_pm_f16_row(ED_PM, n, x, (ed_half *)dst);
    } else if (type == ED_Q8_0) {
        ED_QUANT[ED_Q8_0](x, dst, n);
    } else {
        ed_quantize_row(type, x, dst, n);
    }
}

/* A quantized cache stores rotated rows, as llama.cpp does: when K (V) is quantized and
 * head_dim is a multiple of 64, q and k (v) are multiplied by an orthonormal Walsh-Hadamard
 * matrix before k (v) is stored, and the attention output by the V matrix after (H * H = I).
 * The rotation spreads an outlier channel over the whole block, so a 32-value block's scale is
 * not set by one large value (on SmolLM2-135M a q4_0 K cache without it: KL 0.19 to the F16
 * cache; llama.cpp, rotating: 0.03). K's matrix is the largest power of two dividing head_dim,
 * V's is 64. ed_kv_rot_n: that size, or 0 for no rotation. */
static inline int ed_kv_rot_n(int type, int hd, int is_k) {
    if (type == ED_F16 || type == ED_F32 || hd % 64 != 0) return 0;
    int n = 64;
    if (is_k) while (hd % (2 * n) == 0) n *= 2;
    return n;
}

#include "forward_layers.h"
#include "forward_moe_gemma4.h"
#include "gemma3n.h"

/* x (len, a multiple of n) <- each n-value chunk times the n x n Hadamard matrix / sqrt(n):
 * scaled first, then the butterflies (u + v, u - v) with spans 1, 2, 4, ..., n/2, ggml's fast
 * transform; every operation is one exact-order float add, so any vector width gives these bits */
static void ed_fwht(float *x, int len, int n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int c = 0; c < len; c += n, x += n) {
        for (int j = 0; j < n; j++) x[j] *= scale;
        for (int span = 1; span < n; span <<= 1)
            for (int i = 0; i < n; i += 2 * span)
                for (int j = i; j < i + span; j++) {
                    const float u = x[j], v = x[j + span];
                    x[j] = u + v;
                    x[j + span] = u - v;
                }
    }
}

/* The query of one head in the K type's dot format (q8_0 for a quantized K, as ggml converts
   src1 of a mul_mat / flash attention's Q); q already carries gemma3's scale */
static inline void ed_kq_query(int type_k, const float *q, int hd, void *qk) {
    ED_QUANT[ED_TRAITS[type_k].vec_type](q, qk, hd);
}

/* q.k against a quantized K row: the type's integer dot product (ggml's vec_dot_q8_0_q8_0,
   vec_dot_q4_0_q8_0) */
static inline float ed_kq_dot_quant(int type_k, int hd, const uint8_t *k, const void *qk) {
    return ED_DOT[type_k](hd, k, qk);
}

/* acc += vs * V row for a quantized row of hd values: ggml's v_to_float (dequantize_row_q8_0,
   _q4_0: value = d * q) then vec_mad_f32, one 32-value block at a time without a float copy */
static inline void ed_v_acc_quant(int type, int hd, const uint8_t *v, float vs, float *acc) {
    if (type == ED_Q8_0) {
        const blk_q8_0 *b = (const blk_q8_0 *)v;
        for (int i = 0; i < hd / QK; i++, acc += QK) {
            const float d = ed_fp16_to_fp32(b[i].d);
            for (int j = 0; j < QK; j++) acc[j] += (b[i].qs[j] * d) * vs;
        }
    } else {  /* ED_Q4_0: low nibbles are values 0..15 of the block, high nibbles 16..31 */
        const blk_q4_0 *b = (const blk_q4_0 *)v;
        for (int i = 0; i < hd / QK; i++, acc += QK) {
            const float d = ed_fp16_to_fp32(b[i].d);
            for (int j = 0; j < QK / 2; j++) {
                acc[j] += (((b[i].qs[j] & 0x0F) - 8) * d) * vs;
                acc[j + QK / 2] += (((b[i].qs[j] >> 4) - 8) * d) * vs;
            }
        }
    }
}

/* One query row against a cache whose V is quantized. llama.cpp runs such a cache only with
 * flash attention (llama_init_from_model refuses it without), so this is ggml's flash
 * attention loop for one row: q in the K type's dot format, each score q.k times the scale
 * (soft-capped as ggml does: cap * tanh(s * scale / cap)), an online softmax in float (expf),
 * each V row converted to float and added with its weight, the sum divided by the softmax
 * total at the end; a sink logit (gpt-oss; -INFINITY for none) joins the maximum and the
 * total after the keys, as ggml adds it. kc/vc: cell j0's K/V of this KV head; krow/vrow:
 * bytes between cells. qk: the query's scratch, acc: hd floats. */
static void ed_attn_flash_row(const ed_state *s, int hd, const float *q, float scale,
                              float cap, float sink, const uint8_t *kc, size_t krow, const uint8_t *vc,
                              size_t vrow, int nj, void *qk, float *acc, float *out) {
    const int tk = s->type_k, tv = s->type_v;
    const ed_pm_fns pm = *ED_PM;
    ed_kq_query(tk, q, hd, qk);
    const float sc = cap != 0.0f ? scale / cap : scale;
    float S = 0.0f, M = -INFINITY;
    memset(acc, 0, sizeof(float) * hd);
    for (int j = 0; j < nj; j++) {
        const uint8_t *k = kc + (size_t)j * krow;
        float d = tk == ED_F16 ? ed_pm_dot(&pm, hd, (const uint16_t *)k, (const uint16_t *)qk)
                               : ed_kq_dot_quant(tk, hd, k, qk);
        d *= sc;
        if (cap != 0.0f) d = cap * tanhf(d);
        float ms = 1.0f, vs = 1.0f;
        if (d > M) {  /* a new maximum: the sums so far shrink by expf(old - new) */
            ms = expf(M - d);
            M = d;
            for (int i = 0; i < hd; i++) acc[i] *= ms;
        } else {
            vs = expf(d - M);
        }
        ed_v_acc_quant(tv, hd, vc + (size_t)j * vrow, vs, acc);
        S = S * ms + vs;
    }
    if (sink != -INFINITY) {  /* llama.cpp: the sink logit joins M and S after the keys, adds no V */
        float ms = 1.0f, vs = 1.0f;
        if (sink > M) {
            ms = expf(M - sink);
            M = sink;
            for (int i = 0; i < hd; i++) acc[i] *= ms;
        } else {
            vs = expf(sink - M);
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < hd; i++) out[i] = acc[i] * inv;
}

/* ---------------------------------------------------------------- attention ------------ */
static void ed_forward_init(void) {
    ed_pm_init();
}

/* Causal (and sliding-window) attention over the F16 cache for this thread's (token, head)
 * pairs, as llama.cpp computes one token without flash attention (ed_parity.h): q rounded to
 * F16, q.k in F16, softmax in float with ggml's expf, the softmax row rounded to F16, times the
 * F16 V, each sum in ggml_vec_dot_f16's order. The V sum keeps one row of head_dim partial sums
 * per SIMD lane of that dot product (64), added to with ed_axpy_f16 (exact products, so any
 * path gives the same sums), and reduces them in its tree. This is the canonical order of
 * attention (docs/engine.md, "Reproducibility"): every row of every batch gets these bits,
 * here or in the blocked kernels below, on every kernel path. q was already multiplied by
 * attn_scale where the model scales q (gemma3). Output into xb (n, Qd).
 * A quantized K (q8_0, q4_0): q in q8_0 and the type's integer dot (ggml's mul_mat); a
 * quantized V: ed_attn_flash_row. Every row of every batch reads a quantized cache here (the
 * blocked kernels take F16 caches only), so a prompt row and the one-token path read the same
 * stored rows in the same order: the same bits. (Reading them back in F16 for the blocked
 * kernel, with the queries in q8_0, was tried: 0.074 from llama.cpp's logits on the kv-q8_0
 * golden, over the 0.05 tolerance.) */
static const float ED_ZERO_ROW[1024];
#define ED_ATTN_LANES 64

static void ed_attention_exact(ed_state *s, const ed_model *m, int il, int ith, int nth, int ldqkv) {
    const ed_layer *C = &m->layers[m->layers[il].kv_src];  /* the layer whose cache it reads */
    const int n = s->n_tokens, hd = C->head_dim, group = m->n_head / C->n_head_kv;
    const int kvd = C->n_head_kv * hd, Qd = m->n_head * hd, lanes = ED_ATTN_LANES;
    const size_t k_row = ed_layer_row(s, 0, C), v_row = ed_layer_row(s, 1, C);
    const ed_pm_fns pm = *ED_PM;  /* the path's (ed_parity.h), copied once for the loops */
    const float kqscale = m->scale_q ? 1.0f : m->attn_scale;
    const float cap = m->attn_softcap;
    float *sc = s->att + (size_t)ith * s->att_stride;
    float *acc = s->vacc + (size_t)ith * 80 * hd, *tmp = acc + (size_t)64 * hd;
    const float *lane[64];
    uint16_t *q16 = s->qh + (size_t)ith * hd;
    const int swa = m->layers[il].swa && m->n_swa > 0;
    const float *sink = m->layers[il].attn_sinks.data ? ed_vec(&m->layers[il].attn_sinks) : NULL;
    int64_t a, b;
    ed_range((int64_t)n * m->n_head, ith, nth, &a, &b);
    for (int64_t idx = a; idx < b; idx++) {
        const int t = (int)(idx / m->n_head), h = (int)(idx % m->n_head), kvh = h / group;
        const int pt = ed_row_pos(s, t), hi = ed_row_hi(s, pt);
        const uint8_t *kl = ed_layer_cache(s, 0, t, il), *vl = ed_layer_cache(s, 1, t, il);
        const size_t koff = ed_kv_bytes(s->type_k, (int64_t)kvh * hd);
        const float *q = s->qkv + (size_t)t * ldqkv + (size_t)h * hd;
        int j0 = 0;
        if (swa && pt - m->n_swa + 1 > 0) j0 = pt - m->n_swa + 1;
        const int nj = hi - j0 + 1;
        if (s->type_v != ED_F16) {  /* a quantized V: flash attention, as llama.cpp requires */
            ed_attn_flash_row(s, hd, q, kqscale, cap, sink ? sink[h] : -INFINITY,
                              kl + (size_t)j0 * k_row + koff, k_row,
                              vl + (size_t)j0 * v_row + ed_kv_bytes(s->type_v, (int64_t)kvh * hd),
                              v_row, nj, q16, acc, s->xb + (size_t)t * Qd + (size_t)h * hd);
            continue;
        }
        const uint16_t *vc = (const uint16_t *)vl;
        if (s->type_k == ED_F16) ed_pm_f16_row(&pm, hd, q, q16);
        else ed_kq_query(s->type_k, q, hd, q16);
        float mx = sink ? sink[h] : -INFINITY;  /* llama.cpp: the sink joins the max... */
        for (int j = j0; j <= hi; j++) {
            float d = s->type_k == ED_F16
                ? ed_pm_dot(&pm, hd, (const uint16_t *)kl + (size_t)j * kvd + (size_t)kvh * hd, q16)
                : ed_kq_dot_quant(s->type_k, hd, kl + (size_t)j * k_row + koff, q16);
            if (cap != 0.0f) d = tanhf(d * (1.0f / cap)) * cap;  /* llama.cpp: before the scale */
            d *= kqscale;
            sc[j] = d;
            if (d > mx) mx = d;
        }
        /* softmax: ggml's expf; groups of 16 cache cells summed in float, the groups in double */
        ed_pm_expf_sub(&pm, nj, sc + j0, mx, sc + j0);
        double sum = 0.0;
        for (int g = j0 & ~15; g <= hi; g += 16) {
            float l[16];
            for (int k = 0; k < 16; k++) l[k] = g + k >= j0 && g + k <= hi ? sc[g + k] : 0.0f;
            sum += ed_pm_hsum16(l);
        }
        if (sink) sum += (double)expf(sink[h] - mx);  /* ... and the sum, not the output */
        ed_pm_round_scale(&pm, nj, sc + j0, (float)(1.0 / sum));  /* the F16 softmax row */
        /* softmax row x V: cell j adds into lane j % lanes */
        const int used = nj < lanes ? nj : lanes;
        for (int r = 0; r < lanes; r++) lane[r] = ED_ZERO_ROW;
        for (int j = j0; j < j0 + used; j++) {
            float *row = acc + (size_t)(j % lanes) * hd;
            memset(row, 0, sizeof(float) * hd);
            lane[j % lanes] = row;
        }
        for (int j = j0; j <= hi; j++)
            if (sc[j] != 0.0f) ed_axpy_f16(hd, sc[j], vc + (size_t)j * kvd + (size_t)kvh * hd, acc + (size_t)(j % lanes) * hd);
        if (used < lanes)  /* fewer keys than lanes: only the used lanes' adds (the same bits) */
            ed_pm_reduce_lanes_sparse(hd, lane, ED_ZERO_ROW, tmp, s->xb + (size_t)t * Qd + (size_t)h * hd);
        else
            ed_pm_reduce_lanes(hd, lanes, lane, tmp, s->xb + (size_t)t * Qd + (size_t)h * hd);
    }
}

/* The same attention, the work cut into blocks of query rows that share a KV head and a cache
 * (tb tokens x hc of the heads of one KV head), which ed_attn (ed_simd.h: query rows as vector
 * lanes, each row in the canonical order above) runs; threads take blocks from an atomic
 * counter, latest tokens (most keys) first, so they finish together although causal rows have
 * unequal work. In a batch of several sessions a block stops where the cache changes.
 * s->attn_next is reset by thread 0 before the barrier that precedes. */
static void ed_attention_blocked(ed_state *s, const ed_model *m, int il, int ith, int nth, int ldqkv) {
    const ed_layer *C = &m->layers[m->layers[il].kv_src];  /* the layer whose cache it reads */
    const int n = s->n_tokens, hd = C->head_dim, n_kv = C->n_head_kv, group = m->n_head / n_kv;
    const int kvd = n_kv * hd, Qd = m->n_head * hd;
    const int swa = m->layers[il].swa && m->n_swa > 0;
    const float kqscale = m->scale_q ? 1.0f : m->attn_scale;
    const float *sink = m->layers[il].attn_sinks.data ? ed_vec(&m->layers[il].attn_sinks) : NULL;
    /* fewer heads per block only when there are fewer blocks than threads (decode) */
    int hc = group < ED_ATTN_ROWS ? group : ED_ATTN_ROWS, hs, tb, ntb;
    /* one token (decode): one head per block, so the threads share more items (the kernel runs
       blocks this small row by row anyway) */
    if (n == 1) hc = 1;
    for (;;) {
        hs = (group + hc - 1) / hc;
        tb = ED_ATTN_ROWS / hc;
        ntb = (n + tb - 1) / tb;
        if (hc == 1 || (int64_t)ntb * n_kv * hs >= nth) break;
        hc--;
    }
    const int per_tb = n_kv * hs, n_items = ntb * per_tb;
    float *ws = s->att + (size_t)ith * s->att_stride;
    ed_attn_row rw[ED_ATTN_ROWS];
    for (int next = 0;;) {
        const int it = nth > 1 ? atomic_fetch_add_explicit(&s->attn_next, 1, memory_order_relaxed) : next++;
        if (it >= n_items) break;
        const int tb0 = (ntb - 1 - it / per_tb) * tb, tb1 = tb0 + tb < n ? tb0 + tb : n;
        const int kvh = it % per_tb / hs, h0 = kvh * group + it % hs * hc;
        const int h1 = h0 + hc < (kvh + 1) * group ? h0 + hc : (kvh + 1) * group;
        const size_t off = (size_t)kvh * hd;
        for (int t0 = tb0, t1; t0 < tb1; t0 = t1) {
            const uint8_t *kc = ed_layer_cache(s, 0, t0, il);
            for (t1 = t0 + 1; t1 < tb1 && ed_layer_cache(s, 0, t1, il) == kc; t1++) {}
            int nr = 0;
            for (int t = t0; t < t1; t++) {
                const int pt = ed_row_pos(s, t);
                const int lo = swa && pt - m->n_swa + 1 > 0 ? pt - m->n_swa + 1 : 0;
                for (int h = h0; h < h1; h++, nr++) {
                    rw[nr].q = s->qkv + (size_t)t * ldqkv + (size_t)h * hd;
                    rw[nr].o = s->xb + (size_t)t * Qd + (size_t)h * hd;
                    rw[nr].lo = lo;
                    rw[nr].hi = ed_row_hi(s, pt);
                    rw[nr].sink = sink ? sink[h] : -INFINITY;
                }
            }
            ed_attn(nr, rw, (const uint16_t *)kc + off, (const uint16_t *)ed_layer_cache(s, 1, t0, il) + off, kvd, hd,
                    kqscale, ws);
        }
    }
}

/* Both give the same bits; the x86 kernels (blocks of rows as vector lanes, and one row with
 * keys as lanes for small blocks: decode) are faster from one row on. They cover head dims
 * that are multiples of 64 without soft-capping (gemma2). */
static void ed_attention(ed_state *s, const ed_model *m, int il, int ith, int nth, int ldqkv) {
    if (ed_attn != ed_attn_rowwise && m->layers[il].head_dim % ED_ATTN_LANES == 0 &&
        m->attn_softcap == 0.0f &&  /* the blocked kernel has no soft-capping */
        s->type_k == ED_F16 && s->type_v == ED_F16)  /* nor a quantized cache: the row path reads it */
        ed_attention_blocked(s, m, il, ith, nth, ldqkv);
    else
        ed_attention_exact(s, m, il, ith, nth, ldqkv);
}

/* ---------------------------------------------------------------- the forward pass ----- */
#include <time.h>
static inline double ed_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
/* thread 0 charges the time since the last mark to an op kind (ops end in barriers, so its
   clock covers the slowest thread); off unless the session asked for a profile */
#define ED_MARK(arr, kind) do { if (prof) { double t_ = ed_now_ns(); s->arr[kind] += t_ - t_prev; t_prev = t_; } } while (0)

/* The last layer after attention (whose K/V rows every token needs) runs only for the rows
 * whose logits are wanted, as llama.cpp does: thread 0 moves their attention outputs (xb) and
 * residuals (x) to rows 0..n_out (out_rows ascending: a row never moves down onto one still to
 * be read). Every row is computed in the canonical order whatever the batch, so their bits do
 * not change. Returns the rows left; the caller's barrier follows. */
static int ed_last_rows(ed_state *s, int n, int Qd, int E, int ith) {
    if (s->all_rows || s->n_out >= n) return n;
    if (ith == 0)
        for (int i = 0; i < s->n_out; i++) {
            const int r = s->out_rows[i];
            if (r == i) continue;
            memcpy(s->xb + (size_t)i * Qd, s->xb + (size_t)r * Qd, sizeof(float) * Qd);
            memcpy(s->x + (size_t)i * E, s->x + (size_t)r * E, sizeof(float) * E);
            if (s->m->n_altup) ed_altup_move_row(s, i, r);
        }
    return s->n_out;
}

static void ed_forward_worker(void *arg, int ith, int nth) {
    ed_state *s = (ed_state *)arg;
    const ed_model *m = s->m;
    ed_pool *p = s->pool;
    int n = s->n_tokens;
    const int E = m->n_embd;
    const float eps = m->rms_eps, rs = m->residual_scale;
    int64_t a, b;
    int rows = n;  /* the rows the last layer runs: out_rows moved to the front, or all */
    ed_range(n, ith, nth, &a, &b);  /* this thread's tokens for per-row ops */
    const int prof = s->profile && ith == 0;
    double t_prev = prof ? ed_now_ns() : 0.0;

    for (int il = 0; il < m->n_layer; il++) {
        const ed_layer *L = &m->layers[il];
        const int F = L->n_ff, hd = L->head_dim, n_kv = L->n_head_kv;  /* this layer's sizes */
        const int Qd = m->n_head * hd, KVd = n_kv * hd;
        const int Qw = m->attn_gated_q ? 2 * Qd : Qd, QKV = Qw + 2 * KVd;  /* q (| gate), k, v */
        const int rot_k = ed_kv_rot_n(s->type_k, hd, 1), rot_v = ed_kv_rot_n(s->type_v, hd, 0);
        const int own_kv = L->kv_src == il;  /* else it attends over an earlier layer's K/V */
        /* gemma4: per-layer inputs and output scale after the residual (forward_layers.h) */
        const int ends = m->n_embd_per_layer || L->layer_output_scale.data;
        if (m->n_altup) {  /* gemma3n: x and its attn_norm from the streams */
            ed_altup_predict(s, p, m, L, il, n, ith, nth);
            ED_MARK(prof_ns, ED_PROF_NORM);
        } else if (il == 0) {  /* later layers get their attn_norm from the previous residual step */
            if (m->n_embd_per_layer) ed_ple_inputs(s, p, m, n, ith, nth);
            for (int64_t t = a; t < b; t++) ed_rms_norm(s->xb + t * E, s->x + t * E, ed_vec(&L->attn_norm), E, eps);
            ed_barrier(p);
            ED_MARK(prof_ns, ED_PROF_NORM);
        }
        if (L->laurel_l.data) ed_laurel(s, p, m, L, n, ith, nth);  /* gemma3n, from xb */
        /* the output projection's input rows (xb) */
        const int ldo = L->conv ? E : L->recr ? m->ssm_d_inner : Qd;
        if (L->conv) {
            ed_shortconv(s, p, m, L, n, a, b, ith, nth);
        } else if (L->recr && L->ssm_in.data) {
            ed_mamba2(s, p, m, L, n, a, b, ith, nth);
        } else if (L->recr) {
            ed_deltanet(s, p, m, L, n, a, b, ith, nth);
        } else {
        if (L->attn_qkv.data) {
            ed_matmul(s, p, s->qkv, QKV, &L->attn_qkv, s->xb, E, n, 0, ith, nth);
        } else if (!own_kv || !L->attn_v.data) {  /* gemma4: q alone, or q and k (V = K) */
            ed_matmul(s, p, s->qkv, QKV, &L->attn_q, s->xb, E, n, 0, ith, nth);
            if (own_kv)
                ed_matmul(s, p, s->qkv + Qw, QKV, &L->attn_k, s->xb, E, n,
                          L->attn_k.type == L->attn_q.type && !(ed_reads_info(&L->attn_k) & ~ed_reads_info(&L->attn_q)), ith, nth);
        } else if (ed_same_act(&L->attn_q, &L->attn_k) && ed_same_act(&L->attn_q, &L->attn_v)) {
            const ed_tensor *W3[3] = {&L->attn_q, &L->attn_k, &L->attn_v};
            float *O3[3] = {s->qkv, s->qkv + Qw, s->qkv + Qw + KVd};
            ed_matmul3(s, p, W3, O3, QKV, s->xb, E, n, ith, nth);
        } else {
            ed_matmul(s, p, s->qkv, QKV, &L->attn_q, s->xb, E, n, 0, ith, nth);
            ed_matmul(s, p, s->qkv + Qw, QKV, &L->attn_k, s->xb, E, n,
                      L->attn_k.type == L->attn_q.type && !(ed_reads_info(&L->attn_k) & ~ed_reads_info(&L->attn_q)), ith, nth);
            ed_matmul(s, p, s->qkv + Qw + KVd, QKV, &L->attn_v, s->xb, E, n,
                      L->attn_v.type == L->attn_k.type && !(ed_reads_info(&L->attn_v) & ~ed_reads_info(&L->attn_k)), ith, nth);
        }
        ED_MARK(prof_mm, L->attn_qkv.data ? L->attn_qkv.type : L->attn_q.type);
        const float base = L->swa ? m->rope_freq_base_swa : m->rope_freq_base;
        const float fscale = L->swa ? m->rope_freq_scale_swa : m->rope_freq_scale;
        for (int64_t t = a; t < b; t++) {
            float *q = s->qkv + t * QKV, *k = q + Qw, *v = k + KVd;
            if (m->attn_gated_q) ed_split_gate(s, m, q, t);
            if (L->attn_q_bias.data) {
                const float *bq = ed_vec(&L->attn_q_bias), *bk = ed_vec(&L->attn_k_bias), *bv = ed_vec(&L->attn_v_bias);
                for (int i = 0; i < Qd; i++) q[i] += bq[i];
                for (int i = 0; i < KVd; i++) { k[i] += bk[i]; v[i] += bv[i]; }
            }
            if (own_kv && !L->attn_v.data && !L->attn_qkv.data)  /* gemma4: V is K's projection */
                memcpy(v, k, sizeof(float) * KVd);
            if (L->attn_q_norm.data)
                for (int h = 0; h < m->n_head; h++) ed_rms_norm(q + h * hd, q + h * hd, ed_vec(&L->attn_q_norm), hd, eps);
            if (L->attn_k_norm.data)
                for (int h = 0; h < n_kv; h++) ed_rms_norm(k + h * hd, k + h * hd, ed_vec(&L->attn_k_norm), hd, eps);
            if (m->v_norm && own_kv)
                for (int h = 0; h < n_kv; h++) ed_rms_norm(v + h * hd, v + h * hd, NULL, hd, eps);
            const int pt = ed_row_pos(s, t);
            const float *ff = L->rope_ff ? m->rope_factors : NULL;
            if (L->rope) {
                ed_rope_ext(q, m->n_head, hd, L->n_rot, pt, base, fscale, ff, m->rope_attn_factor,
                            m->rope_neox, m->rope_ext_factor, m->n_ctx_orig, m->yarn_beta_fast, m->yarn_beta_slow);
                if (own_kv)
                    ed_rope_ext(k, n_kv, hd, L->n_rot, pt, base, fscale, ff, m->rope_attn_factor,
                                m->rope_neox, m->rope_ext_factor, m->n_ctx_orig, m->yarn_beta_fast, m->yarn_beta_slow);
            }
            if (rot_k) { ed_fwht(q, Qd, rot_k); if (own_kv) ed_fwht(k, KVd, rot_k); }
            if (rot_v && own_kv) ed_fwht(v, KVd, rot_v);
            if (m->scale_q)  /* gemma3: q times attn_scale before it is rounded (F16 or q8_0) */
                for (int i = 0; i < Qd; i++) q[i] *= m->attn_scale;
            if (!own_kv) continue;
            ed_kv_store(s->type_k, k, ed_layer_cache(s, 0, t, il) + (size_t)pt * ed_layer_row(s, 0, L), KVd);
            ed_kv_store(s->type_v, v, ed_layer_cache(s, 1, t, il) + (size_t)pt * ed_layer_row(s, 1, L), KVd);
        }
        if (ith == 0) atomic_store_explicit(&s->attn_next, 0, memory_order_relaxed);
        ed_barrier(p);
        ED_MARK(prof_ns, ED_PROF_ROPE);
        ed_attention(s, m, il, ith, nth, QKV);
        ed_barrier(p);
        if (rot_v) {  /* the output back from V's rotation */
            for (int64_t t = a; t < b; t++) ed_fwht(s->xb + (size_t)t * Qd, Qd, rot_v);
            ed_barrier(p);
        }
        if (m->attn_gated_q) {
            ed_apply_gate(s, m, a, b);
            ed_barrier(p);
        }
        }
        if (il == m->n_layer - 1) {
            rows = ed_last_rows(s, n, ldo, E, ith);
            if (rows < n) {
                ed_barrier(p);
                n = rows;
                ed_range(n, ith, nth, &a, &b);
                if (n == 0) break;  /* no logits wanted (a prompt chunk of a batch) */
            }
        }
        ED_MARK(prof_ns, ED_PROF_ATTN);
        const ed_tensor *Wo = L->conv ? &L->shortconv_out_proj : L->recr ? &L->ssm_out : &L->attn_output;
        ed_matmul(s, p, s->xb2, E, Wo, s->xb, ldo, n, 0, ith, nth);
        ED_MARK(prof_mm, Wo->type);
        for (int64_t t = a; t < b; t++) {
            float *o = s->xb2 + t * E, *x = s->x + t * E;
            if (L->attn_output_bias.data) {
                const float *bo = ed_vec(&L->attn_output_bias);
                for (int i = 0; i < E; i++) o[i] += bo[i];
            }
            if (L->post_attention_norm.data) ed_rms_norm(o, o, ed_vec(&L->post_attention_norm), E, eps);
            for (int i = 0; i < E; i++) x[i] += o[i] * rs;
            if (L->laurel_l.data) ed_laurel_join(s, x, t, E);
            ed_rms_norm(s->xb + t * E, x, ed_vec(&L->ffn_norm), E, eps);
        }
        ed_barrier(p);
        ED_MARK(prof_ns, ED_PROF_NORM);
        if (L->pre_ffw_norm_2.data) {  /* gemma4: the dense FFN beside the routed experts */
            ed_gemma4_moe_ffn(s, p, m, L, n, ith, nth);
            ED_MARK(prof_mm, L->ffn_down_exps.type);
        } else if (m->n_expert) {
            ed_moe_ffn(s, p, m, L, s->xb, n, ith, nth);
            ED_MARK(prof_mm, L->ffn_up_exps.type);
        } else {
            if (L->sparsity != 0.0f) ed_sparse_gate_up(s, p, m, L, n, ith, nth);  /* gemma3n */
            else ed_ffn_gate_up(s, p, m, L, n, ith, nth);
            ED_MARK(prof_mm, L->ffn_up.type);
            ed_matmul(s, p, s->xb2, E, &L->ffn_down, s->hb, 2 * F, n, 0, ith, nth);
            ED_MARK(prof_mm, L->ffn_down.type);
        }
        for (int64_t t = a; t < b; t++) {
            float *o = s->xb2 + t * E, *x = s->x + t * E;
            if (L->post_ffw_norm.data) ed_rms_norm(o, o, ed_vec(&L->post_ffw_norm), E, eps);
            for (int i = 0; i < E; i++) x[i] += o[i] * rs;
            if (il + 1 < m->n_layer && !ends)  /* the next layer's attn_norm, while x is in cache */
                ed_rms_norm(s->xb + t * E, x, ed_vec(&m->layers[il + 1].attn_norm), E, eps);
        }
        ed_barrier(p);
        if (m->n_altup) ed_altup_layer_end(s, p, m, L, il, n, ith, nth);
        else if (ends) ed_layer_end(s, p, m, L, il, n, ith, nth);
        ED_MARK(prof_ns, ED_PROF_NORM);
    }
    if (m->n_altup && n) ed_altup_end(s, p, m, n, ith, nth);  /* gemma3n: the streams into x */
    const int compact = rows < s->n_tokens;  /* the wanted rows are at the front already */
    rows = s->n_out;
    ed_range(rows, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++)
        ed_rms_norm(s->xb + t * E, s->x + (size_t)(compact ? t : s->out_rows[t]) * E,
                    ed_vec(&m->output_norm), E, eps);
    ed_barrier(p);
    ed_matmul(s, p, s->logits, m->n_vocab, &m->output, s->xb, E, rows, 0, ith, nth);
    if (m->final_logit_softcap > 0.0f) {
        ed_range((int64_t)rows * m->n_vocab, ith, nth, &a, &b);
        for (int64_t i = a; i < b; i++) s->logits[i] = tanhf(s->logits[i] / m->final_logit_softcap) * m->final_logit_softcap;
        ed_barrier(p);
    }
    if (m->logit_mul != 1.0f) {
        ed_range((int64_t)rows * m->n_vocab, ith, nth, &a, &b);
        for (int64_t i = a; i < b; i++) s->logits[i] *= m->logit_mul;
        ed_barrier(p);
    }
    ED_MARK(prof_ns, ED_PROF_OUTPUT);
}


/* ---------------------------------------------------------------- setup ---------------- */
#ifndef ED_ALIGN
#define ED_ALIGN(n) (((n) + 63) & ~(size_t)63)
#endif

/* Carve one session's buffers out of `arena` (64-byte aligned). With arena == NULL only
 * computes the size. Returns the bytes needed. */
static size_t ed_state_layout(ed_state *s, const ed_model *m, int n_ctx, int n_batch,
                              int n_threads, int type_k, int type_v, uint8_t *arena) {
    const int E = m->n_embd, hd = m->head_dim, Qd = m->n_head * hd, KVd = m->n_head_kv * hd;
    const int F = m->n_ff > m->n_ff_exp ? (m->n_ff > m->n_ff_shexp ? m->n_ff : m->n_ff_shexp)
                : (m->n_ff_exp > m->n_ff_shexp ? m->n_ff_exp : m->n_ff_shexp);
    const int Vd = m->ssm_d_inner;  /* a recurrent layer's output */
    const int XB = E > Qd ? (E > Vd ? E : Vd) : (Qd > Vd ? Qd : Vd);
    /* the longest row a product reads: n_ff, xb's, or per-layer inputs' P (gemma4, gemma3n) */
    const int KX = F > XB ? (F > m->n_embd_per_layer ? F : m->n_embd_per_layer)
                          : (XB > m->n_embd_per_layer ? XB : m->n_embd_per_layer);
    /* widest activation row that gets quantized: n_embd, Qd, n_ff or P inputs, any type */
    size_t xq_row = 0;
    for (int t = 0; t < ED_NTYPES; t++) {
        if (!ED_TRAITS[t].ref) continue;
        size_t r = ed_act_row_bytes(t, KX);
        if (r > xq_row) xq_row = r;
    }
    xq_row = xq_row + 4 * sizeof(float);  /* any type: <= 4 bytes/elem + block headers */
    const size_t xq_bytes = (size_t)(n_batch > n_threads ? n_batch : n_threads) * xq_row;
    size_t off = 0;
#define CARVE(field, type, count) do { \
        if (arena) s->field = (type *)(arena + off); \
        off += ED_ALIGN(sizeof(type) * (size_t)(count)); } while (0)
    const size_t k_row = ed_kv_bytes(type_k, KVd), v_row = ed_kv_bytes(type_v, KVd);
    /* each layer's rows at its own size, none for a layer reading another's (forward_layers.h) */
    CARVE(kv_off, size_t, 2 * (size_t)m->n_layer);
    size_t kv_rows[2];  /* bytes of one position's K rows and V rows, all layers */
    ed_kv_offsets(m, type_k, type_v, arena ? s->kv_off : NULL, kv_rows);
    CARVE(k_cache, uint8_t, (size_t)n_ctx * kv_rows[0]);
    CARVE(v_cache, uint8_t, (size_t)n_ctx * kv_rows[1]);
    CARVE(x, float, (size_t)n_batch * E);
    CARVE(xb, float, (size_t)n_batch * XB);
    CARVE(xb2, float, (size_t)n_batch * E);
    int QKVW = (m->attn_gated_q ? 2 * Qd : Qd) + 2 * KVd;
    if (m->n_conv_layers && 3 * E > QKVW) QKVW = 3 * E;
    if (m->n_recr_layers && ed_recr_row(m) > QKVW) QKVW = ed_recr_row(m);
    CARVE(conv_cache, float, (size_t)m->n_conv_layers * n_ctx * E);
    CARVE(qkv, float, (size_t)n_batch * QKVW);  /* q|k|v, a convolution's B|C|x, DeltaNet's rows */
    CARVE(rstate, float, (size_t)m->n_recr_layers * ed_recr_layer_floats(m));
    CARVE(gate, float, m->attn_gated_q ? (size_t)n_batch * Qd : 0);
    CARVE(alt, float, (size_t)n_batch * m->n_altup * E);  /* gemma3n.h */
    CARVE(laurel, float, m->n_altup ? (size_t)n_batch * E : 0);
    CARVE(altc, float, (size_t)n_batch * m->n_altup * (m->n_altup + 1));
    const int P = m->n_embd_per_layer;  /* gemma4's per-layer inputs: P-wide rows in hb too */
    CARVE(hb, float, (size_t)n_batch * (2 * F > P ? 2 * F : P));
    CARVE(ple, float, (size_t)n_batch * m->n_layer * P);
    CARVE(ple_proj, float, (size_t)n_batch * m->n_layer * P);
    const size_t att_stride = ED_ALIGN(sizeof(float) * (ed_attn_ws_floats(hd, n_ctx) > (size_t)n_ctx
                                                        ? ed_attn_ws_floats(hd, n_ctx) : (size_t)n_ctx)) / sizeof(float);
    CARVE(att, float, (size_t)n_threads * att_stride);
    CARVE(qh, uint16_t, (size_t)n_threads * hd);
    CARVE(vacc, float, (size_t)n_threads * 80 * hd);
    CARVE(xq, uint8_t, xq_bytes);
    const size_t gemm_bytes = n_batch > 1 ? ed_gemm_scratch(KX) : 0;
    const size_t xinfo_row = ed_gemm_info_len(KX);
    CARVE(gemm, uint8_t, (size_t)n_threads * gemm_bytes);
    CARVE(xinfo, ed_ginfo, (size_t)(n_batch > 1 ? n_batch : 0) * xinfo_row);
    CARVE(xdy, float, n_batch > 1 ? ed_gemm_dy_len(n_batch, KX) : 0);
    CARVE(logits, float, (size_t)(n_batch < ED_MAX_LOGIT_ROWS ? n_batch : ED_MAX_LOGIT_ROWS) * m->n_vocab);
    CARVE(tokens, int32_t, n_batch);
    CARVE(out_rows, int32_t, ED_MAX_LOGIT_ROWS);
    CARVE(row_pos, int32_t, n_batch);
    CARVE(row_nctx, int32_t, n_batch);
    CARVE(row_k, uint8_t *, n_batch);
    CARVE(row_v, uint8_t *, n_batch);
    CARVE(row_c, float *, n_batch);
    CARVE(row_r, float *, n_batch);
    if (m->n_expert) {
        const size_t nk = (size_t)n_batch * m->n_expert_used;
        CARVE(probs, float, (size_t)n_batch * m->n_expert);
        CARVE(sel, int32_t, nk);
        CARVE(selw, float, nk);
        CARVE(order, int32_t, nk);
        CARVE(where, int32_t, nk);
        CARVE(eoff, int32_t, m->n_expert + 1);
        CARVE(xe, float, (size_t)n_batch * E);
        CARVE(ye, float, nk * E);
    }
#undef CARVE
    if (arena) {
        s->n_ctx = n_ctx; s->n_batch = n_batch; s->xq_row = xq_row; s->m = m;
        s->type_k = type_k; s->type_v = type_v; s->k_row = k_row; s->v_row = v_row;
        s->gemm_bytes = gemm_bytes; s->xinfo_row = xinfo_row; s->att_stride = att_stride;
    }
    return off;
}

/* all_rows: every row's final residual stays in s->x (hidden states), not only the last's */
static void ed_forward(ed_state *s, ed_pool *p, int n_tokens, int pos, int all_logits, int all_rows) {
    s->n_tokens = n_tokens; s->pos = pos; s->pool = p; s->all_rows = all_rows;
    s->n_out = all_logits ? n_tokens : 1;
    for (int i = 0; i < s->n_out; i++) s->out_rows[i] = n_tokens - s->n_out + i;
    ed_pool_run(p, ed_forward_worker, s);
}

/* One step of several sessions of the same model in one pass: row t is the token staged in
 * s->x[t] at position pos[t] of rows[t]'s KV cache (the next token of sessions that decode,
 * the rows of a prompt chunk of another at consecutive positions); every matrix product is
 * shared, attention runs per row against its own cache. s lends its scratch (n <= its n_batch,
 * every pos[t] < rows[t]'s and s's n_ctx, no position twice in a cache: checked by the
 * caller); the logits of rows out[0..n_out) (ascending, n_out <= ED_MAX_LOGIT_ROWS) land in
 * s->logits in that order. */
static void ed_forward_rows(ed_state *s, ed_pool *p, int n, ed_state *const *rows, const int *pos,
                            int n_out, const int *out) {
    for (int t = 0; t < n; t++) {
        s->row_pos[t] = pos[t];
        s->row_nctx[t] = rows[t]->n_ctx;
        s->row_k[t] = rows[t]->k_cache;
        s->row_v[t] = rows[t]->v_cache;
        s->row_c[t] = rows[t]->conv_cache;
        s->row_r[t] = rows[t]->rstate;
    }
    for (int i = 0; i < n_out; i++) s->out_rows[i] = out[i];
    s->n_tokens = n; s->pos = 0; s->pool = p; s->n_out = n_out; s->all_rows = 0;
    s->batched = 1;
    ed_pool_run(p, ed_forward_worker, s);
    s->batched = 0;
}

#endif
