/* Gemma 4's mixture-of-experts FFN (26B-A4B; included from forward.h after ed_moe_ffn).
 *
 * As llama.cpp's gemma4 graph: the dense FFN stays beside the routed experts as a shared
 * expert, each with its own norms, both reading x (the residual after attention):
 *   mlp = rms_norm(FFN(ffn_norm(x))) * post_ffw_norm_1
 *   moe = rms_norm(experts(pre_ffw_norm_2(x); router on rms_norm(x) / sqrt(n_embd) *
 *         ffn_gate_inp.scale)) * post_ffw_norm_2
 * and the layer's FFN output is mlp + moe (post_ffw_norm and the residual follow as for any
 * gemma layer). The routed part is ed_moe_ffn with its own router input.
 */
#ifndef EDGED_FORWARD_MOE_GEMMA4_H
#define EDGED_FORWARD_MOE_GEMMA4_H

/* xb holds ffn_norm(x) on entry; the FFN output (mlp + moe) in xb2. Scratch: the experts'
   xe (router input, then their gathered rows) and ye (then the dense FFN's output). */
static void ed_gemma4_moe_ffn(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L,
                              int n, int ith, int nth) {
    const int E = m->n_embd;
    const float eps = m->rms_eps, inv = 1.0f / sqrtf((float)E);
    const float *rsc = ed_vec(&L->ffn_gate_inp_scale);
    int64_t a, b;
    ed_range(n, ith, nth, &a, &b);
    for (int64_t t = a; t < b; t++) {  /* the router's and the experts' inputs */
        const float *x = s->x + t * E;
        float *r = s->xe + t * E;
        ed_rms_norm(r, x, NULL, E, eps);
        for (int i = 0; i < E; i++) r[i] = (r[i] * inv) * rsc[i];
        ed_rms_norm(s->xb + t * E, x, ed_vec(&L->pre_ffw_norm_2), E, eps);
    }
    ed_barrier(p);
    ed_moe_ffn(s, p, m, L, s->xe, n, ith, nth);
    for (int64_t t = a; t < b; t++) {  /* the experts' norm; the dense FFN's input again */
        float *o = s->xb2 + t * E;
        ed_rms_norm(o, o, ed_vec(&L->post_ffw_norm_2), E, eps);
        ed_rms_norm(s->xb + t * E, s->x + t * E, ed_vec(&L->ffn_norm), E, eps);
    }
    ed_barrier(p);
    ed_ffn_gate_up(s, p, m, L, n, ith, nth);
    ed_matmul(s, p, s->ye, E, &L->ffn_down, s->hb, 2 * L->n_ff, n, 0, ith, nth);
    for (int64_t t = a; t < b; t++) {  /* llama.cpp: mlp + moe */
        float *o = s->xb2 + t * E, *y = s->ye + t * E;
        ed_rms_norm(y, y, ed_vec(&L->post_ffw_norm_1), E, eps);
        for (int i = 0; i < E; i++) o[i] = y[i] + o[i];
    }
    ed_barrier(p);
}

#endif
