/* attnbench's CPU decode steps for the RNN states, each step one call: the feature-map states of `linear` (elu + 1)
 * and `performer` (positive random features, a running key scale), and the d x e states of the gated recurrences
 * (gated linear: RetNet, GLA; the delta rule: DeltaNet, Gated DeltaNet). Features and gates are computed here from the
 * token's q and k, the state is updated in place and read by the query in one pass over it (the delta rule: two, the
 * second from L1). float32; q, k, v and out hold one token per (batch, head) row; every stride in elements. Each
 * function parallelises over (batch, head) rows with OpenMP once the state is large enough to pay for the team
 * (PARALLEL_FLOATS). Each has an eager PyTorch reference it is tested against
 * (tests/variants/test_fused_recurrent_steps.py): the formulas are those of variants/linear.py,
 * feature_attention.py, gated_linear.py, gated_kernels.py and delta_kernels.py. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MIN_LOG_DECAY -100.f /* recurrent_forms.MIN_LOG_DECAY: a log decay below it is a reset to float precision */
#define NORM_EPS 1e-6f       /* recurrent_forms.NORM_EPS: fla's l2norm, x / sqrt(|x|^2 + eps) */
/* A step starts a team of threads only for a state of at least this many floats: torch's own grain
 * (at::internal::GRAIN_SIZE), so a step goes parallel where a torch op of its size would. At B=1, H=8, D=64 (32K
 * floats) a team of two took the kernel call from 5.5 to 4.2 us (linear), 21 to 16 (performer), in turns on a 2-core
 * EPYC VM at load 3.5 (tests/benchmarks/recurrent_step_speed.py); with both cores taken by other processes, a team
 * waits for its second thread (up to ms), as torch's ops do. */
#define PARALLEL_FLOATS 32768
/* e^x with no libm call, so that loops over it vectorise (libm's expf, one call per element, ran ~10x slower):
 * x = n ln 2 + r, |r| <= ln 2 / 2 (Cody-Waite, its two parts fused so that -funsafe-math cannot merge them), e^r by
 * Cephes' expf polynomial, 2^n put in the exponent bits. Within 1.3 ulp of e^x for -87 < x < 88; 0 below (-inf
 * included; libm gives subnormals there), e^88 above (libm: up to inf past 88.7; the steps' exponents are <= 0 but
 * for a plugin's own gates); NaN stays NaN. */
static inline float fast_exp(float x) {
    float c = x > -87.f ? (x < 88.f ? x : 88.f) : -87.f;
    float n = floorf(c * 1.44269504088896341f + 0.5f);
    float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, c));
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x > -87.f ? p * two_n : (x == x ? 0.f : x);
}

/* log(1 + e) for e in [0, 1], vectorisable as `fast_exp`: Cephes' logf of u = 1 + e (halved above sqrt 2). Within
 * 8e-8 of log1p(e) (measured over e in [1e-30, 1]): at most a relative 8e-8 / tau in a gate e^(log sigmoid / tau). */
static inline float log_one_plus(float e) {
    float u = 1.f + e, big = u > 1.41421356f ? 1.f : 0.f;
    float x = (big > 0.f ? 0.5f * u : u) - 1.f, z = x * x;
    float y = 7.0376836292e-2f;
    y = y * x - 1.1514610310e-1f;
    y = y * x + 1.1676998740e-1f;
    y = y * x - 1.2420140846e-1f;
    y = y * x + 1.4249322787e-1f;
    y = y * x - 1.6668057665e-1f;
    y = y * x + 2.0000714765e-1f;
    y = y * x - 2.4999993993e-1f;
    y = y * x + 3.3333331174e-1f;
    y = y * x * z - 0.5f * z;
    return fmaf(big, 0.693359375f, fmaf(big, -2.12194440e-4f, y) + x);
}

/* log sigmoid(x) = min(x, 0) - log(1 + e^-|x|), and sigmoid(x), without overflow at either end. */
static inline float log_sigmoid(float x) { return (x < 0.f ? x : 0.f) - log_one_plus(fast_exp(-fabsf(x))); }

static inline float sigmoid(float x) {
    float e = fast_exp(-fabsf(x));
    return (x >= 0.f ? 1.f : e) / (1.f + e);
}

static inline float clamped(float log_decay) { return log_decay > MIN_LOG_DECAY ? log_decay : MIN_LOG_DECAY; }

static inline float dot(const float *a, const float *b, int64_t n) {
    float total = 0.f;
    for (int64_t x = 0; x < n; x++) total += a[x] * b[x];
    return total;
}

/* Rows m < n of a state (strided sr, `cols` each) written and read in one pass: row_m = row_m * decay_m + key_m val,
 * then acc += query_m row_m (decay strided ds: 0 for one decay for every row). Four rows at a time, so acc is loaded
 * and stored once per four rows: a row at a time, each row's acc waited on the last one's store (measured: half of
 * the performer's step). */
static void update_and_read(float *state, int64_t sr, int64_t n, int64_t cols, const float *restrict decay, int64_t ds,
                            const float *restrict key, const float *restrict val, const float *restrict query,
                            float *restrict acc) {
    int64_t m = 0;
    for (; m + 4 <= n; m += 4) {
        float *r0 = state + m * sr, *r1 = r0 + sr, *r2 = r1 + sr, *r3 = r2 + sr;
        float a0 = decay[m * ds], a1 = decay[(m + 1) * ds], a2 = decay[(m + 2) * ds], a3 = decay[(m + 3) * ds];
        float k0 = key[m], k1 = key[m + 1], k2 = key[m + 2], k3 = key[m + 3];
        float q0 = query[m], q1 = query[m + 1], q2 = query[m + 2], q3 = query[m + 3];
        for (int64_t x = 0; x < cols; x++) {
            float w0 = r0[x] * a0 + k0 * val[x], w1 = r1[x] * a1 + k1 * val[x];
            float w2 = r2[x] * a2 + k2 * val[x], w3 = r3[x] * a3 + k3 * val[x];
            r0[x] = w0, r1[x] = w1, r2[x] = w2, r3[x] = w3;
            acc[x] += q0 * w0 + q1 * w1 + q2 * w2 + q3 * w3;
        }
    }
    for (; m < n; m++) {
        float *row = state + m * sr, a = decay[m * ds], k = key[m], q = query[m];
        for (int64_t x = 0; x < cols; x++) {
            row[x] = row[x] * a + k * val[x];
            acc[x] += q * row[x];
        }
    }
}

/* acc += sum_m weight_m row_m over rows m < n of a state (strided sr, `cols` each), four rows at a time. */
static void read_rows(const float *state, int64_t sr, int64_t n, int64_t cols, const float *restrict weight,
                      float *restrict acc) {
    int64_t m = 0;
    for (; m + 4 <= n; m += 4) {
        const float *r0 = state + m * sr, *r1 = r0 + sr, *r2 = r1 + sr, *r3 = r2 + sr;
        float w0 = weight[m], w1 = weight[m + 1], w2 = weight[m + 2], w3 = weight[m + 3];
        for (int64_t x = 0; x < cols; x++) acc[x] += w0 * r0[x] + w1 * r1[x] + w2 * r2[x] + w3 * r3[x];
    }
    for (; m < n; m++)
        for (int64_t x = 0; x < cols; x++) acc[x] += weight[m] * state[m * sr + x];
}

/* A feature state's step for one head: each row m of the state (M rows of E + 1, the normalizer last) scaled by
 * `rescale`, then phi_k[m] [v 1] added, then read by phi_q; out = numerators / normalizer (0 where it is 0). */
static void fold_features(const float *phi_q, const float *phi_k, const float *v, float *state, int64_t sm, int64_t M,
                          int64_t E, float rescale, float *out) {
    float with_one[E + 1], acc[E + 1];
    memcpy(with_one, v, sizeof(float) * E);
    with_one[E] = 1.f;
    memset(acc, 0, sizeof(float) * (E + 1));
    update_and_read(state, sm, M, E + 1, &rescale, 0, phi_k, with_one, phi_q, acc);
    for (int64_t x = 0; x < E; x++) out[x] = acc[E] != 0.f ? acc[x] / acc[E] : 0.f;
}

/* `linear`'s step: phi(x) = elu(x) + 1 (e^x at or below 0) of q and k (D), the state (b, h) of D rows strided sm. */
void linear_step(const float *q, const float *k, const float *v, float *state, float *out, int64_t B, int64_t H,
                 int64_t D, int64_t E, int64_t qb, int64_t qh, int64_t kb, int64_t kh, int64_t vb, int64_t vh,
                 int64_t sb, int64_t sh, int64_t sm, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (B * H * D * (E + 1) >= PARALLEL_FLOATS)
    for (int64_t row = 0; row < B * H; row++) {
        int64_t b = row / H, h = row % H;
        const float *qr = q + b * qb + h * qh, *kr = k + b * kb + h * kh;
        float phi_q[D], phi_k[D];
        for (int64_t x = 0; x < D; x++) {
            phi_q[x] = qr[x] > 0.f ? qr[x] + 1.f : fast_exp(qr[x]);
            phi_k[x] = kr[x] > 0.f ? kr[x] + 1.f : fast_exp(kr[x]);
        }
        fold_features(phi_q, phi_k, v + b * vb + h * vh, state + b * sb + h * sh, sm, D, E, 1.f, out + row * E);
    }
}

/* `performer`'s step (positive features): log features w . x' of q and k through the projection (M, D) contiguous
 * (the normalizer d^-1/4 folded in), the key's less |k'|^2 / 2; the query's relative to its own max, the key's to the
 * new running scale top = max(scale, max_m), the state rescaled by e^(scale - top) and the scale (b, h) strided
 * (cb, ch) set to top. */
void performer_step(const float *q, const float *k, const float *v, float *state, float *scale,
                    const float *projection, float *out, int64_t B, int64_t H, int64_t D, int64_t M, int64_t E,
                    int64_t qb, int64_t qh, int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t sb, int64_t sh,
                    int64_t sm, int64_t cb, int64_t ch, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (B * H * M * (E + 1) >= PARALLEL_FLOATS)
    for (int64_t row = 0; row < B * H; row++) {
        int64_t b = row / H, h = row % H;
        const float *qr = q + b * qb + h * qh, *kr = k + b * kb + h * kh;
        float phi_q[M], phi_k[M], query_top = -INFINITY, key_top = -INFINITY;
        float half_norm = dot(kr, kr, D) * (0.5f / sqrtf((float)D));
        for (int64_t m = 0; m < M; m++) {
            const float *w = projection + m * D;
            float from_q = 0.f, from_k = 0.f;
            for (int64_t x = 0; x < D; x++) {
                from_q += w[x] * qr[x];
                from_k += w[x] * kr[x];
            }
            phi_q[m] = from_q, phi_k[m] = from_k - half_norm;
            query_top = phi_q[m] > query_top ? phi_q[m] : query_top;
            key_top = phi_k[m] > key_top ? phi_k[m] : key_top;
        }
        float *running = scale + b * cb + h * ch, top = key_top > *running ? key_top : *running;
        float rescale = fast_exp(*running - top);
        *running = top;
        for (int64_t m = 0; m < M; m++) {
            phi_q[m] = fast_exp(phi_q[m] - query_top);
            phi_k[m] = fast_exp(phi_k[m] - top);
        }
        fold_features(phi_q, phi_k, v + b * vb + h * vh, state + b * sb + h * sh, sm, M, E, rescale, out + row * E);
    }
}

/* Gated linear attention's step: S = diag(e^gk) S + k v^T, out = scale S^T q, the state (b, h) of D rows strided sd.
 * The log decays gk (D per head, clamped at MIN_LOG_DECAY): with `down` (D, R) and `up` (R, D) contiguous, GLA's
 * low-rank gate log sigmoid((k down) up) / normalizer; else read from gk strided (gb, gh, gd) (a 0 stride
 * broadcasts: RetNet's one decay per head). */
void gated_linear_step(const float *q, const float *k, const float *v, float *state, const float *gk,
                       const float *down, const float *up, float *out, int64_t B, int64_t H, int64_t D, int64_t E,
                       int64_t R, int64_t qb, int64_t qh, int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t sb,
                       int64_t sh, int64_t sd, int64_t gb, int64_t gh, int64_t gd, float normalizer, float scale,
                       int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (B * H * D * E >= PARALLEL_FLOATS)
    for (int64_t row = 0; row < B * H; row++) {
        int64_t b = row / H, h = row % H;
        const float *qr = q + b * qb + h * qh, *kr = k + b * kb + h * kh;
        float decay[D], acc[E];
        if (down != NULL) {
            float low[R > 0 ? R : 1];
            for (int64_t r = 0; r < R; r++) low[r] = 0.f;
            for (int64_t x = 0; x < D; x++)
                for (int64_t r = 0; r < R; r++) low[r] += kr[x] * down[x * R + r];
            for (int64_t x = 0; x < D; x++) decay[x] = 0.f;
            for (int64_t r = 0; r < R; r++)
                for (int64_t x = 0; x < D; x++) decay[x] += low[r] * up[r * D + x];
            for (int64_t x = 0; x < D; x++) {
                float logit = decay[x];
                decay[x] = fast_exp(clamped(log_sigmoid(logit) / normalizer));
            }
        } else {
            for (int64_t x = 0; x < D; x++) decay[x] = fast_exp(clamped(gk[b * gb + h * gh + x * gd]));
        }
        memset(acc, 0, sizeof(float) * E);
        update_and_read(state + b * sb + h * sh, sd, D, E, decay, 1, kr, v + b * vb + h * vh, qr, acc);
        for (int64_t y = 0; y < E; y++) out[row * E + y] = acc[y] * scale;
    }
}

/* The delta rule's step on L2-normalised q and k: S' = e^g S; u = beta (v - S'^T k); S = S' + k u^T; out = scale S^T q.
 * beta and g: with `weights` (D, 2) contiguous, from the raw key, beta = sigmoid(k . w_0) and, when `decayed`,
 * g = log sigmoid(k . w_1) / normalizer; else read from beta strided (bb, bh) and g strided (gb, gh), g NULL for none.
 * g clamped at MIN_LOG_DECAY. Two passes over the state (b, h) of D rows strided sd: S^T k, then the update and the
 * read (the head's state still in L1). */
void delta_step(const float *q, const float *k, const float *v, float *state, const float *beta, const float *g,
                const float *weights, float *out, int64_t B, int64_t H, int64_t D, int64_t E, int64_t qb, int64_t qh,
                int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t sb, int64_t sh, int64_t sd, int64_t bb,
                int64_t bh, int64_t gb, int64_t gh, int64_t decayed, float normalizer, float scale, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (B * H * D * E >= PARALLEL_FLOATS)
    for (int64_t row = 0; row < B * H; row++) {
        int64_t b = row / H, h = row % H;
        const float *qr = q + b * qb + h * qh, *kr = k + b * kb + h * kh, *vr = v + b * vb + h * vh;
        float *sr = state + b * sb + h * sh, qn[D], kn[D], u[E], acc[E];
        float strength, log_decay = 0.f;
        if (weights != NULL) {
            float beta_logit = 0.f, decay_logit = 0.f;
            for (int64_t x = 0; x < D; x++) {
                beta_logit += kr[x] * weights[2 * x];
                decay_logit += kr[x] * weights[2 * x + 1];
            }
            strength = sigmoid(beta_logit);
            if (decayed) log_decay = log_sigmoid(decay_logit) / normalizer;
        } else {
            strength = beta[b * bb + h * bh];
            if (g != NULL) log_decay = g[b * gb + h * gh];
        }
        float a = fast_exp(clamped(log_decay));
        float q_factor = 1.f / sqrtf(dot(qr, qr, D) + NORM_EPS), k_factor = 1.f / sqrtf(dot(kr, kr, D) + NORM_EPS);
        for (int64_t x = 0; x < D; x++) {
            qn[x] = qr[x] * q_factor;
            kn[x] = kr[x] * k_factor;
        }
        memset(u, 0, sizeof(float) * E);
        read_rows(sr, sd, D, E, kn, u);
        for (int64_t y = 0; y < E; y++) u[y] = strength * (vr[y] - a * u[y]);
        memset(acc, 0, sizeof(float) * E);
        update_and_read(sr, sd, D, E, &a, 0, kn, u, qn, acc);
        for (int64_t y = 0; y < E; y++) out[row * E + y] = acc[y] * scale;
    }
}
