/* Mamba-2 (granitehybrid's recurrent layers), included by forward.h after deltanet.h, whose
 * state helpers it shares (ed_recr_state, ed_recr_conv_dim, ed_recr_row).
 *
 * As llama.cpp's build_mamba2_layer with ggml's ssm_conv and ssm_scan: ssm_in gives z (d_inner),
 * xBC (d_inner + 2 G N: x, then B and C of the G groups) and dt (H heads). xBC runs through the
 * causal depthwise convolution (the sequence's last d_conv - 1 inputs kept in its state), its
 * bias and SiLU. Per token and head h (group g = h / (H / G)), dt = softplus(dt + dt_bias),
 * dA = exp(dt A); per row p of the head's (head_dim, N) state
 *   s_p = s_p dA + B_g x_p dt;  y_p = s_p . C_g + D x_p
 * then y times silu(z), an RMS norm per group of d_inner / G values (ssm_norm), and ssm_out
 * (the caller). The state is float32 per sequence (edged/engine/recurrent.py has the layout).
 * Every token runs the recurrence (llama.cpp's CPU order; the chunked "SSD" form sums in another
 * order and is not used), so one batch, chunks and one token at a time give the same bits; the
 * dot products sum in 8 lanes then a fixed tree, in the generic C every path compiles.
 * Numpy twin: edged/engine/reference_granite.py. */
#ifndef EDGED_MAMBA2_H
#define EDGED_MAMBA2_H

/* One row of the causal depthwise convolution (deltanet.h's ed_conv_row, with the bias) and
   its SiLU, over channels c0..c1. */
static void ed_m2_conv_row(float *st, const float *raw, float *out, const float *w,
                           const float *bias, int C, int taps, int64_t c0, int64_t c1) {
    ed_conv_row(st, raw, out, w, bias, C, taps, c0, c1);
    for (int64_t c = c0; c < c1; c++) out[c] = ed_silu(out[c]);
}

/* One row p of a head's state (N values): s = s dA + B xdt, returns s . C summed in 8 lanes
   then a fixed tree. Its own function with restrict pointers and size_t indices so that the
   compiler vectorizes it (it did not inlined, nor with int indices under -fwrapv). */
__attribute__((noinline))
static float ed_m2_state_row(float *restrict sr, const float *restrict B, const float *restrict C,
                             float dA, float xdt, int N) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;   /* unsigned indices: Python's -fwrapv keeps int ones from vectorizing */
    for (; j + 8 <= (size_t)N; j += 8)
        for (size_t k = 0; k < 8; k++) {
            const float v = sr[j + k] * dA + B[j + k] * xdt;
            sr[j + k] = v;
            l[k] += v * C[j + k];
        }
    for (; j < (size_t)N; j++) {
        const float v = sr[j] * dA + B[j] * xdt;
        sr[j] = v;
        l[j & 7] += v * C[j];
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* The Mamba-2 block for the n rows normed in xb; output (n, d_inner) in xb. Ends in a barrier. */
static void ed_mamba2(ed_state *s, ed_pool *p, const ed_model *m, const ed_layer *L, int n,
                      int64_t a, int64_t b, int ith, int nth) {
    const int E = m->n_embd, di = m->ssm_d_inner, N = m->ssm_d_state, G = m->ssm_n_group;
    const int H = m->ssm_dt_rank, hd = di / H, taps = m->ssm_d_conv, ch = ed_recr_conv_dim(m);
    const int W = ed_recr_row(m), dproj = di + ch + H;
    float *r = s->qkv;  /* (n, W): z | xBC | dt (ssm_in), then the convolution's output (ch) */
    ed_matmul(s, p, r, W, &L->ssm_in, s->xb, E, n, 0, ith, nth);
    const float *dtb = ed_vec(&L->ssm_dt);
    for (int64_t t = a; t < b; t++) {  /* dt = softplus(dt + dt_bias), as ggml in float */
        float *dt = r + (size_t)t * W + di + ch;
        for (int h = 0; h < H; h++) {
            const float x = dt[h] + dtb[h];
            dt[h] = x > 20.0f ? x : logf(1.0f + expf(x));
        }
    }
    /* the causal convolution, channel by channel; the rows in order (a row's window holds the
       inputs before it: its sequence's state, then the rows of the batch before it) */
    const float *w = ed_vec(&L->ssm_conv1d);  /* (ch, taps) */
    const float *cb = L->ssm_conv1d_b.data ? ed_vec(&L->ssm_conv1d_b) : NULL;
    int64_t c0, c1;
    ed_range(ch, ith, nth, &c0, &c1);
    for (int t = 0; t < n; t++)   /* the state's conv block (taps - 1, ch) first */
        ed_m2_conv_row(ed_recr_state(s, m, L, t), r + (size_t)t * W + di,
                         r + (size_t)t * W + dproj, w, cb, ch, taps, c0, c1);
    ed_barrier(p);
    /* the selective scan, heads split over threads; rows in order. y = (s . C + D x) silu(z) */
    const float *A = ed_vec(&L->ssm_a), *D = ed_vec(&L->ssm_d);
    int64_t h0, h1;
    ed_range(H, ith, nth, &h0, &h1);
    for (int t = 0; t < n; t++) {
        float *st = ed_recr_state(s, m, L, t) + (size_t)(taps - 1) * ch;  /* (H, hd, N) */
        const float *row = r + (size_t)t * W, *x = row + dproj;
        float *y = s->xb + (size_t)t * di;
        for (int64_t h = h0; h < h1; h++) {
            const int g = (int)(h / (H / G));
            const float *B = x + di + (size_t)g * N, *C = x + di + (size_t)(G + g) * N;
            const float dt = row[di + ch + h], dA = expf(dt * A[h]);
            for (int i = 0; i < hd; i++) {   /* hot loop: one row of the head's state */
                const size_t ii = (size_t)h * hd + i;
                const float sum = ed_m2_state_row(st + ii * N, B, C, dA, x[ii] * dt, N);
                y[ii] = (sum + x[ii] * D[h]) * ed_silu(row[ii]);
            }
        }
    }
    ed_barrier(p);
    /* the gated RMS norm: groups of d_inner / G values (ssm_norm) */
    const float *nw = ed_vec(&L->ssm_norm);
    const int gs = di / G;
    for (int64_t t = a; t < b; t++)
        for (int g = 0; g < G; g++) {
            float *o = s->xb + (size_t)t * di + (size_t)g * gs;
            ed_rms_norm(o, o, nw + (size_t)g * gs, gs, m->rms_eps);
        }
    ed_barrier(p);
}

#endif
