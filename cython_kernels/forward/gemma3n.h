/* Gemma 3n's AltUp streams, LAuReL and activation sparsity (included from forward.h), as
 * llama.cpp's src/models/gemma3n.cpp computes them.
 *
 * The hidden state is n_altup (4) streams, s->alt (n_batch, n_altup, n_embd); stream 0 is the
 * active one (altup.active_idx, fixed by edged/engine/gemma3n.py). Before the first layer the
 * embedding x0 is stream 0 and altup_proj[i] x0, scaled to x0's magnitude, stream i + 1. At
 * each layer's start the streams predict each other (ed_altup_predict: coefficients from a
 * tanh router on the active stream); the active prediction is the residual x of an ordinary
 * block, whose LAuReL branch (ed_laurel) joins it after attention and whose FFN gate is cut at
 * mean + sparsity * std on the first layers (ed_sparse_gate_up). At its end every stream is
 * corrected by the block's innovation x - prediction, and the active one, gated by the
 * token's per-layer input (forward_layers.h's ed_ple_inputs), is added to the others
 * (ed_altup_layer_end). After the last layer the streams are projected back, scaled to the
 * active one's magnitude and averaged into x (ed_altup_end).
 *
 * Every product goes through ed_matmul, every per-row op is the row's own: a row's bits do
 * not depend on the batch, the chunking or the threads.
 */
#ifndef EDGED_GEMMA3N_H
#define EDGED_GEMMA3N_H

#define ED_MAX_ALTUP 8   /* streams one element's prediction holds in registers */

/* Stream j of batch row t: n_embd floats */
static inline float *ed_alt(const ed_state *s, int64_t t, int j) {
    return s->alt + ((size_t)t * s->m->n_altup + j) * s->m->n_embd;
}

/* Row t's router outputs and coefficients: n_altup modalities, then n_altup^2 (predict) or
   n_altup (correct) coefficients */
static inline float *ed_altc(const ed_state *s, int64_t t) {
    return s->altc + (size_t)t * s->m->n_altup * (s->m->n_altup + 1);
}

/* ggml's calc_magnitude: sqrt of the sum of squares (squares in float, summed in double) */
static inline float ed_magnitude(const float *x, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    return sqrtf((float)sum);
}

/* Row t of x (stride ldx) into the modalities tanh(router . (rms_norm(x) * router_norm / n_embd)).
   All threads; ends in a barrier. */
static void ed_altup_router(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                            const float *x, size_t ldx, int n, int ith, int nth) {
    const int E = m->n_embd, A = m->n_altup, W = A * (A + 1);
    const float inv_e = 1.0f / (float)E;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *r = s->xb2 + t * E;
        ed_rms_norm(r, x + t * ldx, ed_vec(&L->altup_router_norm), E, m->rms_eps);
        for (int i = 0; i < E; i++) r[i] *= inv_e;
    }
    ed_barrier(p);
    ed_matmul(s, p, s->altc, W, &L->altup_router, s->xb2, E, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++)
        for (int j = 0; j < A; j++) ed_altc(s, t)[j] = tanhf(ed_altc(s, t)[j]);
    ed_barrier(p);
}

/* Before the first layer: the per-layer inputs, then the streams from the embeddings in x. */
static void ed_altup_begin(ed_state *s, ed_pool *p, const ed_model *m, int n, int ith, int nth) {
    const int E = m->n_embd, A = m->n_altup;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    ed_ple_inputs(s, p, m, n, ith, nth);
    for (int64_t t = a; t < b; t++) memcpy(ed_alt(s, t, 0), s->x + t * E, sizeof(float) * E);
    for (int i = 0; i < A - 1; i++) {
        const ed_tensor Wi = ed_expert(&m->altup_proj, i);  /* slice i of (E, E, A - 1) */
        ed_matmul(s, p, s->xb2, E, &Wi, s->x, E, n, i > 0, ith, nth);
        for (int64_t t = a; t < b; t++) {
            const float *u = s->xb2 + t * E;
            const float target = ed_magnitude(s->x + t * E, E), mag = ed_magnitude(u, E);
            float *dst = ed_alt(s, t, i + 1);
            for (int d = 0; d < E; d++) dst[d] = u[d] * target / mag;
        }
        ed_barrier(p);
    }
}

/* A layer's start: the streams predicted from each other (in place), x = the active
   prediction, xb = its attn_norm. At layer 0 the streams are made first. All threads; ends
   in a barrier. */
static void ed_altup_predict(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                             int il, int n, int ith, int nth) {
    const int E = m->n_embd, A = m->n_altup, W = A * (A + 1);
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    if (il == 0) ed_altup_begin(s, p, m, n, ith, nth);
    ed_altup_router(s, p, m, L, s->alt, (size_t)A * E, n, ith, nth);
    ed_matmul(s, p, s->altc + A, W, &L->altup_predict_coef, s->altc, W, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++) {
        const float *c = ed_altc(s, t) + A;  /* c[j * A + k]: stream k's share in prediction j */
        float *X = ed_alt(s, t, 0);
        for (int d = 0; d < E; d++) {
            float v[ED_MAX_ALTUP];
            for (int k = 0; k < A; k++) v[k] = X[(size_t)k * E + d];
            for (int j = 0; j < A; j++) {
                float sum = 0.0f;  /* ggml_vec_dot_f32 over the A streams, then + the stream */
                for (int k = 0; k < A; k++) sum += v[k] * c[j * A + k];
                X[(size_t)j * E + d] = sum + v[j];
            }
        }
        memcpy(s->x + t * E, X, sizeof(float) * E);
        ed_rms_norm(s->xb + t * E, X, ed_vec(&L->attn_norm), E, m->rms_eps);
    }
    ed_barrier(p);
}

/* LAuReL: s->laurel rows = rms_norm(laurel_r(laurel_l(xb))) * laurel_post_norm + xb, from the
   attn_norm rows in xb. All threads; no barrier after (the rows are read after attention's). */
static void ed_laurel(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int n,
                      int ith, int nth) {
    const int E = m->n_embd, R = (int)L->laurel_l.ne1;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    ed_matmul(s, p, s->hb, R, &L->laurel_l, s->xb, E, n, 0, ith, nth);
    ed_matmul(s, p, s->laurel, E, &L->laurel_r, s->hb, R, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++) {
        float *o = s->laurel + t * E;
        const float *h = s->xb + t * E;
        ed_rms_norm(o, o, ed_vec(&L->laurel_post_norm), E, m->rms_eps);
        for (int i = 0; i < E; i++) o[i] += h[i];
    }
}

/* After attention's residual: x = (x + laurel) / sqrt(2) for batch row t */
static inline void ed_laurel_join(const ed_state *s, float *x, int64_t t, int E) {
    const float *lr = s->laurel + t * E;
    const float scale = 1.0f / sqrtf(2.0f);
    for (int i = 0; i < E; i++) x[i] = (x[i] + lr[i]) * scale;
}

/* The gated FFN's first half with activation sparsity: gate and up, then per row the gate cut
   at mean + L->sparsity * std (std over n_ff - 1, as llama.cpp's gaussian_topk: sums in double
   like ggml_sum_rows), relu, gelu, times up. hb (n, 2 n_ff) as ed_ffn_gate_up. Ends in a barrier. */
static void ed_sparse_gate_up(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                              int n, int ith, int nth) {
    const int E = m->n_embd, F = L->n_ff;
    const ed_tensor *G = &L->ffn_gate, *U = &L->ffn_up;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    ed_matmul(s, p, s->hb, 2 * F, G, s->xb, E, n, 0, ith, nth);
    ed_matmul(s, p, s->hb + F, 2 * F, U, s->xb, E, n,
              U->type == G->type && !(ed_reads_info(U) & ~ed_reads_info(G)), ith, nth);
    const float inv_f1 = 1.0f / (float)(F - 1);
    for (int64_t t = a; t < b; t++) {
        float *g = s->hb + t * 2 * F, *u = g + F;
        double sum = 0.0;
        for (int i = 0; i < F; i++) sum += (double)g[i];
        const float mean = (float)sum / (float)F;
        double sq = 0.0;
        for (int i = 0; i < F; i++) { const float dv = g[i] - mean; sq += (double)(dv * dv); }
        const float cut = mean + sqrtf((float)sq * inv_f1) * L->sparsity;
        for (int i = 0; i < F; i++) {
            const float v = g[i] - cut;
            g[i] = ed_gelu(v > 0.0f ? v : 0.0f) * u[i];
        }
    }
    ed_barrier(p);
}

/* A layer's end (x: its output): every stream corrected by the innovation x - prediction
   times (1 + the router's coefficient), then the active one times altup_correct_scale through
   the per-layer input gate and projection (ed_ple_gate), RMS-normed, added to the other
   streams. Rows t < n (compacted on the last layer: ed_last_rows). All threads; ends in a
   barrier. */
static void ed_altup_layer_end(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                               int il, int n, int ith, int nth) {
    const int E = m->n_embd, A = m->n_altup, W = A * (A + 1);
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    ed_altup_router(s, p, m, L, s->x, E, n, ith, nth);
    ed_matmul(s, p, s->altc + A, W, &L->altup_correct_coef, s->altc, W, n, 0, ith, nth);
    const float *cs = ed_vec(&L->altup_correct_scale);
    for (int64_t t = a; t < b; t++) {
        const float *c = ed_altc(s, t) + A, *x = s->x + t * E;
        float *X = ed_alt(s, t, 0), *first = s->xb2 + t * E;
        float cj[ED_MAX_ALTUP];
        for (int j = 0; j < A; j++) cj[j] = c[j] + 1.0f;
        for (int d = 0; d < E; d++) {
            const float inno = x[d] - X[d];
            for (int j = 0; j < A; j++) X[(size_t)j * E + d] = inno * cj[j] + X[(size_t)j * E + d];
            first[d] = X[d] * cs[d];
        }
    }
    ed_barrier(p);
    ed_ple_gate(s, p, m, L, il, s->xb2, n, ith, nth);
    for (int64_t t = a; t < b; t++) {
        float *o = s->xb2 + t * E;
        ed_rms_norm(o, o, ed_vec(&L->per_layer_post_norm), E, m->rms_eps);
        for (int j = 1; j < A; j++) {
            float *X = ed_alt(s, t, j);
            for (int d = 0; d < E; d++) X[d] += o[d];
        }
    }
    ed_barrier(p);
}

/* After the last layer, rows t < n: x = (stream 0 + sum over i of altup_unembd_proj[i] stream
   i + 1, each scaled to stream 0's magnitude) / n_altup, added in stream order. All threads;
   ends in a barrier. */
static void ed_altup_end(ed_state *s, ed_pool *p, const ed_model *m, int n, int ith, int nth) {
    const int E = m->n_embd, A = m->n_altup;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {
        memcpy(s->x + t * E, ed_alt(s, t, 0), sizeof(float) * E);
        ed_altc(s, t)[0] = ed_magnitude(ed_alt(s, t, 0), E);  /* the target magnitude */
    }
    for (int i = 0; i < A - 1; i++) {
        const ed_tensor Wi = ed_expert(&m->altup_unembd_proj, i);
        ed_matmul(s, p, s->xb2, E, &Wi, ed_alt(s, 0, i + 1), (int)((size_t)A * E), n, 0, ith, nth);
        for (int64_t t = a; t < b; t++) {
            const float *u = s->xb2 + t * E;
            const float target = ed_altc(s, t)[0], mag = ed_magnitude(u, E);
            float *x = s->x + t * E;
            for (int d = 0; d < E; d++) x[d] += u[d] * target / mag;
        }
        ed_barrier(p);
    }
    const float inv_a = 1.0f / (float)A;
    for (int64_t t = a; t < b; t++)
        for (int d = 0; d < E; d++) s->x[t * E + d] *= inv_a;
    ed_barrier(p);
}

/* ed_last_rows: row r's streams and LAuReL row move to row i with its x and xb */
static inline void ed_altup_move_row(ed_state *s, int i, int r) {
    const int E = s->m->n_embd, A = s->m->n_altup;
    memcpy(ed_alt(s, i, 0), ed_alt(s, r, 0), sizeof(float) * A * E);
    memcpy(s->laurel + (size_t)i * E, s->laurel + (size_t)r * E, sizeof(float) * E);
}

#endif
