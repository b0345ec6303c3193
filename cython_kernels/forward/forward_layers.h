/* Layers of their own sizes, and Gemma 4's per-layer inputs (included from forward.h).
 *
 * A layer descriptor (ed_layer) carries its head size, KV heads, rotary dims and FFN width;
 * for most models they are the model's, for gemma4 they differ between sliding (head 256) and
 * full (head 512) layers. The KV cache holds each layer's rows at their own size, one region
 * of (n_ctx, row) per layer that stores K/V (ed_state.kv_off); a layer with kv_src != itself
 * (gemma4's last shared_kv_layers) stores none and attends over its source layer's region.
 *
 * Per-layer embeddings (gemma4 E2B/E4B, llama.cpp's project_per_layer_inputs): before the
 * first layer, each token's e = per_layer_token_embd[token] * sqrt(P) (staged by the caller in
 * s->ple) becomes (rms_norm(x0 Wp / sqrt(n_embd)) * proj_norm + e) / sqrt(2), n_layer slices
 * of P; after layer il's FFN the residual gains rms_norm(proj(gelu(inp_gate(x)) * slice il)),
 * and layer_output_scale multiplies it.
 */
#ifndef EDGED_FORWARD_LAYERS_H
#define EDGED_FORWARD_LAYERS_H

/* Bytes of one position's K (kv 0) or V (kv 1) row of layer C */
static inline size_t ed_layer_row(const ed_state *s, int kv, const ed_layer *C) {
    return ed_kv_bytes(kv ? s->type_v : s->type_k, (int64_t)C->n_head_kv * C->head_dim);
}

/* off (2, n_layer), unless NULL: bytes of one position's K (V) rows of the layers before il
   that store K/V (attention layers, ed_layer.kv, on their own cache); tot: bytes of one position's K rows and V rows of every layer */
static void ed_kv_offsets(const ed_model *m, int type_k, int type_v, size_t *off, size_t tot[2]) {
    for (int kv = 0; kv < 2; kv++) {
        tot[kv] = 0;
        for (int il = 0; il < m->n_layer; il++) {
            const ed_layer *L = &m->layers[il];
            if (off) off[kv * m->n_layer + il] = tot[kv];
            if (L->kv && L->kv_src == il)  /* attention, on its own cache */
                tot[kv] += ed_kv_bytes(kv ? type_v : type_k, (int64_t)L->n_head_kv * L->head_dim);
        }
    }
}

/* Before the first layer: s->ple rows (n, n_layer * P) from the staged per_layer_token_embd
   rows and the embeddings in s->x. All threads; ends in a barrier. */
static void ed_ple_inputs(ed_state *s, ed_pool *p, const ed_model *m, int n, int ith, int nth) {
    const int E = m->n_embd, P = m->n_embd_per_layer, LP = P * m->n_layer;
    ed_matmul(s, p, s->ple_proj, LP, &m->per_layer_model_proj, s->x, E, n, 0, ith, nth);
    const float proj_scale = 1.0f / sqrtf((float)E), tok_scale = sqrtf((float)P);
    const float inp_scale = 1.0f / sqrtf(2.0f);
    const float *w = ed_vec(&m->per_layer_proj_norm);
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++)
        for (int l = 0; l < m->n_layer; l++) {
            float *pr = s->ple_proj + t * LP + (size_t)l * P, *e = s->ple + t * LP + (size_t)l * P;
            for (int i = 0; i < P; i++) pr[i] *= proj_scale;
            ed_rms_norm(pr, pr, w, P, m->rms_eps);
            for (int i = 0; i < P; i++) e[i] = (pr[i] + e[i] * tok_scale) * inp_scale;
        }
    ed_barrier(p);
}

/* xb2 rows (n, n_embd) = per_layer_proj(gelu(per_layer_inp_gate(x)) * row t's slice il of
   s->ple), before the post norm; x rows of n_embd (rows compacted as in ed_layer_end). All
   threads; ends in a barrier. */
static void ed_ple_gate(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int il,
                        const float *x, int n, int ith, int nth) {
    const int E = m->n_embd, P = m->n_embd_per_layer, LP = P * m->n_layer;
    const int compact = n < s->n_tokens;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    ed_matmul(s, p, s->hb, P, &L->per_layer_inp_gate, x, E, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++) {
        float *g = s->hb + t * P;
        const float *e = s->ple + (size_t)(compact ? s->out_rows[t] : t) * LP + (size_t)il * P;
        for (int i = 0; i < P; i++) g[i] = ed_gelu(g[i]) * e[i];
    }
    ed_barrier(p);
    ed_matmul(s, p, s->xb2, E, &L->per_layer_proj, s->hb, P, n, 0, ith, nth);
}

/* After layer il's residual: its per-layer input and output scale, then the next layer's
   attn_norm into xb. Rows t < n of x; on the last layer the rows may have been compacted
   (ed_last_rows): row t is then batch row out_rows[t]. All threads; ends in a barrier. */
static void ed_layer_end(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int il,
                         int n, int ith, int nth) {
    const int E = m->n_embd, P = m->n_embd_per_layer;
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    if (P) ed_ple_gate(s, p, m, L, il, s->x, n, ith, nth);
    const float scale = L->layer_output_scale.data ? ed_vec(&L->layer_output_scale)[0] : 1.0f;
    for (int64_t t = a; t < b; t++) {
        float *x = s->x + t * E;
        if (P) {
            float *o = s->xb2 + t * E;
            ed_rms_norm(o, o, ed_vec(&L->per_layer_post_norm), E, m->rms_eps);
            for (int i = 0; i < E; i++) x[i] += o[i];
        }
        if (scale != 1.0f) for (int i = 0; i < E; i++) x[i] *= scale;
        if (il + 1 < m->n_layer)
            ed_rms_norm(s->xb + t * E, x, ed_vec(&m->layers[il + 1].attn_norm), E, m->rms_eps);
    }
    ed_barrier(p);
}

#endif
