/* Gated DeltaNet linear attention (qwen35), included by forward.h.
 *
 * A DeltaNet layer keeps, per sequence, a recurrent state of constant size (the live state:
 * edged/engine/recurrent.py has the layout and the checkpoints): the causal convolution's last
 * ssm_d_conv - 1 inputs per channel (conv, (d_conv - 1, C), oldest first) and per value head an
 * S x S matrix M (M[j][i] = llama.cpp's S[i][j]: row j is what the key's i-th entry weighs).
 * Every token runs the recurrence: the canonical order, so one batch, chunks and one token at a
 * time give the same bits (the "chunked" form of llama.cpp sums in another order; not used).
 * Per token and value head h (key head h % ssm_n_group), as ggml_gated_delta_net:
 *   M *= exp(g); d_j = beta (v_j - M_j . k); M_j += d_j k; o_j = (M_j . q) / sqrt(S)
 * with q, k the L2-normed convolution outputs, g = softplus(alpha + dt) * a, beta = sigmoid(b);
 * the output is RMS-normed per head (ssm_norm) times silu(z), then ssm_out (the caller).
 * The dot products sum in 8 lanes then a fixed tree, in the generic C every path runs. */
#ifndef EDGED_DELTANET_H
#define EDGED_DELTANET_H

/* channels of a recurrent layer's convolution: DeltaNet q | k | v, Mamba-2 x | B | C */
static inline int ed_recr_conv_dim(const ed_model *m) {
    return m->ssm_d_inner + 2 * m->ssm_n_group * m->ssm_d_state;
}

/* floats of one recurrent layer's state (its slot's block in the live state): the conv
   inputs, then per head a (ssm_d_inner / ssm_dt_rank) x ssm_d_state matrix */
static inline size_t ed_recr_layer_floats(const ed_model *m) {
    return (size_t)(m->ssm_d_conv - 1) * ed_recr_conv_dim(m) + (size_t)m->ssm_d_inner * m->ssm_d_state;
}

/* the live state of layer L that batch row t updates */
static inline float *ed_recr_state(const ed_state *s, const ed_model *m, const ed_layer *L, int64_t t) {
    return (s->batched ? s->row_r[t] : s->rstate) + (size_t)(L->recr - 1) * ed_recr_layer_floats(m);
}

/* One row of a causal depthwise convolution over channels c0..c1, before its activation:
   out[c] = the last taps - 1 inputs in the state st (taps - 1, C) and this row's raw[c],
   dotted with the channel's taps w[c] (+ bias[c] if any); then raw[c] joins the state and the
   oldest input leaves. Rows of a sequence must run in order. DeltaNet and Mamba-2 share it. */
static void ed_conv_row(float *st, const float *raw, float *out, const float *w,
                        const float *bias, int C, int taps, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++) {
        const float *wc = w + (size_t)c * taps;
        float sum = 0.0f;
        for (int k = 0; k < taps - 1; k++) sum += st[(size_t)k * C + c] * wc[k];
        sum += raw[c] * wc[taps - 1];
        for (int k = 0; k + 1 < taps - 1; k++) st[(size_t)k * C + c] = st[(size_t)(k + 1) * C + c];
        if (taps > 1) st[(size_t)(taps - 2) * C + c] = raw[c];
        out[c] = bias ? sum + bias[c] : sum;
    }
}

/* width of a row of the recurrent scratch (s->qkv): DeltaNet raw q|k|v (C), z (Vd), beta and
   alpha (H_v each), then the convolution's output (C); Mamba-2's z | xBC | dt, conv output
   (one H fewer) fits too */
static inline int ed_recr_row(const ed_model *m) {
    return 2 * ed_recr_conv_dim(m) + m->ssm_d_inner + 2 * m->ssm_dt_rank;
}

/* The state's row products sum in 8 lanes (element i in lane i % 8), then a fixed tree. The
   lanes are two GCC vectors of 4 (an SSE or NEON register each on every path: vectorized
   however the loops are inlined); the short tail adds into its lanes one by one. */
typedef float ed_dn_v4 __attribute__((vector_size(16)));

static inline ed_dn_v4 ed_dn_load(const float *p) {
    ed_dn_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the tail's products (at most one per lane) into the lanes lo = l0..3, hi = l4..7, then
   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float ed_dn_sum(ed_dn_v4 lo, ed_dn_v4 hi, const float *tail) {
    const ed_dn_v4 t = (lo + ed_dn_load(tail)) + (hi + ed_dn_load(tail + 4));
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* a *= decay, then a . b: one pass */
static inline float ed_dn_decay_dot(int n, float *restrict a, float decay, const float *restrict b) {
    ed_dn_v4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const ed_dn_v4 x0 = ed_dn_load(a + i) * decay, x1 = ed_dn_load(a + i + 4) * decay;
        memcpy(a + i, &x0, sizeof x0);
        memcpy(a + i + 4, &x1, sizeof x1);
        lo += x0 * ed_dn_load(b + i);
        hi += x1 * ed_dn_load(b + i + 4);
    }
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i < n; i++) { a[i] *= decay; tail[i & 7] = a[i] * b[i]; }
    return ed_dn_sum(lo, hi, tail);
}

/* a += x * d, then a . q: one pass */
static inline float ed_dn_axpy_dot(int n, float *restrict a, float d, const float *restrict x,
                                   const float *restrict q) {
    ed_dn_v4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const ed_dn_v4 y0 = ed_dn_load(a + i) + ed_dn_load(x + i) * d;
        const ed_dn_v4 y1 = ed_dn_load(a + i + 4) + ed_dn_load(x + i + 4) * d;
        memcpy(a + i, &y0, sizeof y0);
        memcpy(a + i + 4, &y1, sizeof y1);
        lo += y0 * ed_dn_load(q + i);
        hi += y1 * ed_dn_load(q + i + 4);
    }
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i < n; i++) { a[i] += x[i] * d; tail[i & 7] = a[i] * q[i]; }
    return ed_dn_sum(lo, hi, tail);
}

static const float ED_DN_ONES[256] = {[0 ... 255] = 1.0f};

/* The DeltaNet block for the n rows normed in xb; output (n, S * H_v) in xb. Ends in a barrier. */
static void ed_deltanet(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int n,
                        int64_t a, int64_t b, int ith, int nth) {
    const int E = m->n_embd, S = m->ssm_d_state, Hk = m->ssm_n_group, Hv = m->ssm_dt_rank;
    const int C = S * (2 * Hk + Hv), Vd = S * Hv, W = ed_recr_row(m), taps = m->ssm_d_conv;
    const float eps = m->rms_eps, scale = 1.0f / sqrtf((float)S);
    float *r = s->qkv;  /* (n, W): raw | z | beta | alpha | conv out */
    const ed_tensor *Wm[4] = {&L->attn_qkv, &L->attn_gate, &L->ssm_beta, &L->ssm_alpha};
    const int off[4] = {0, C, C + Vd, C + Vd + Hv};
    for (int i = 0; i < 4; i++)   /* one quantization of xb while the activation format holds */
        ed_matmul(s, p, r + off[i], W, Wm[i], s->xb, E, n,
                  i > 0 && Wm[i]->type == Wm[i - 1]->type &&
                  !(ed_reads_info(Wm[i]) & ~ed_reads_info(Wm[i - 1])), ith, nth);
    const float *dt = ed_vec(&L->ssm_dt), *A = ed_vec(&L->ssm_a);
    for (int64_t t = a; t < b; t++) {
        float *be = r + (size_t)t * W + C + Vd, *al = be + Hv;
        for (int h = 0; h < Hv; h++) {
            be[h] = 1.0f / (1.0f + expf(-be[h]));
            const float x = al[h] + dt[h];
            al[h] = (x > 20.0f ? x : logf(1.0f + expf(x))) * A[h];   /* the gate g */
        }
    }
    /* the causal convolution, channel by channel; the rows in order (a row's window holds the
       inputs before it: its sequence's state, then the rows of the batch before it) */
    const float *w = ed_vec(&L->ssm_conv1d);  /* (C, taps) */
    int64_t c0, c1;
    ed_range(C, ith, nth, &c0, &c1);
    for (int t = 0; t < n; t++) {
        float *st = ed_recr_state(s, m, L, t);  /* conv (taps - 1, C) */
        const float *raw = r + (size_t)t * W;
        float *out = r + (size_t)t * W + C + Vd + 2 * Hv;
        ed_conv_row(st, raw, out, w, NULL, C, taps, c0, c1);
        for (int64_t c = c0; c < c1; c += 256)   /* silu(sum) * 1: the path's vector silu */
            ed_pm_silu_mul(ED_PM, (int)(c1 - c < 256 ? c1 - c : 256), out + c, ED_DN_ONES);
    }
    ed_barrier(p);
    /* q and k L2-normed per head as llama.cpp: rms_norm(x, eps / S) / sqrt(S) */
    const float isq = 1.0f / sqrtf((float)S);
    for (int64_t t = a; t < b; t++) {
        float *qk = r + (size_t)t * W + C + Vd + 2 * Hv;
        for (int h = 0; h < 2 * Hk; h++) {
            float *x = qk + (size_t)h * S;
            ed_rms_norm(x, x, NULL, S, eps / (float)S);
            for (int i = 0; i < S; i++) x[i] *= isq;
        }
    }
    ed_barrier(p);
    /* the gated delta rule, value heads split over threads; each head's rows in order, so its
       S x S state stays in the cache through a prompt batch; two passes over a state row */
    int64_t h0, h1;
    ed_range(Hv, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++) {
        for (int t = 0; t < n; t++) {
            float *M = ed_recr_state(s, m, L, t) + (size_t)(taps - 1) * C + (size_t)h * S * S;
            const float *row = r + (size_t)t * W, *cv = row + C + Vd + 2 * Hv;
            const float *q = cv + (size_t)(h % Hk) * S, *k = cv + (size_t)(Hk + h % Hk) * S;
            const float *v = cv + (size_t)(2 * Hk + h) * S;
            const float beta = row[C + Vd + h], decay = expf(row[C + Vd + Hv + h]);
            float *o = s->xb + (size_t)t * Vd + (size_t)h * S;
            for (int j = 0; j < S; j++) {
                float *Mj = M + (size_t)j * S;
                const float d = (v[j] - ed_dn_decay_dot(S, Mj, decay, k)) * beta;
                o[j] = ed_dn_axpy_dot(S, Mj, d, k, q) * scale;
            }
        }
    }
    ed_barrier(p);
    /* RMSNorm per head (ssm_norm) times silu(z) */
    const float *nw = ed_vec(&L->ssm_norm);
    for (int64_t t = a; t < b; t++) {
        float *z = r + (size_t)t * W + C;
        float *o = s->xb + (size_t)t * Vd;
        for (int h = 0; h < Hv; h++) ed_rms_norm(o + (size_t)h * S, o + (size_t)h * S, nw, S, eps);
        ed_pm_silu_mul(ED_PM, Vd, z, o);    /* z = silu(z) * o, the path's vector silu */
        memcpy(o, z, sizeof(float) * Vd);
    }
    ed_barrier(p);
}

/* qwen35's gated attention: attn_q gave each head's query then its gate (q | gate per head, in
   the row's first 2 Qd values); the queries move to the first Qd (what attention reads) and the
   gates to s->gate. Per row, in place: head h's gate is saved before head 2h + 1's query lands
   on it. */
static void ed_split_gate(ed_state *s, const ed_model *m, float *q, int64_t t) {
    const int hd = m->head_dim;
    float *g = s->gate + (size_t)t * m->n_head * hd;
    for (int h = 0; h < m->n_head; h++) {
        memcpy(g + (size_t)h * hd, q + (size_t)(2 * h + 1) * hd, sizeof(float) * hd);
        if (h) memmove(q + (size_t)h * hd, q + (size_t)2 * h * hd, sizeof(float) * hd);
    }
}

/* the attention output (xb rows a..b, Qd wide) times sigmoid(gate) */
static void ed_apply_gate(ed_state *s, const ed_model *m, int64_t a, int64_t b) {
    const size_t Qd = (size_t)m->n_head * m->head_dim;
    for (int64_t t = a; t < b; t++) {
        float *o = s->xb + (size_t)t * Qd;
        const float *g = s->gate + (size_t)t * Qd;
        for (size_t i = 0; i < Qd; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
    }
}

#endif
