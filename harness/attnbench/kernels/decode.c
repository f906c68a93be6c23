/* attnbench's CPU decode kernels: one new token's attention read where the cache lies (no gathered copy), and the
 * recurrent steps fused. float32, keys/values with a contiguous last axis; strides in elements. Each function
 * parallelises over (batch, head) rows with OpenMP (torch's own runtime: the library links the libgomp torch loads).
 * Built once per machine by attnbench.kernels.build; every function has an eager PyTorch reference it is tested
 * against. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CHUNK 64 /* positions scored at once before their values are read */

/* `rows` query rows (q, stride D) sharing one key/value head, against `count` consecutive positions, each key and
 * value read once for all of them, folded into their running softmaxes m[rows], l[rows], acc[rows * E] (the online
 * softmax of flash attention); a position whose visible[j] is 0 is skipped (visible NULL: every position). A chunk's
 * scores first, then its max, its exponentials (vectorised) and its values: no dependence from one position to the
 * next inside a pass. */
static void fold_group(const float *q, int64_t rows, const float *k, const float *v, const uint8_t *visible,
                       int64_t count, int64_t kn, int64_t vn, int64_t d, int64_t e, float scale, float *m, float *l,
                       float *acc) {
    float s[CHUNK * rows];
    for (int64_t start = 0; start < count; start += CHUNK) {
        int64_t n = count - start < CHUNK ? count - start : CHUNK;
        for (int64_t j = 0; j < n; j++) {
            const float *key = k + (start + j) * kn;
            int shown = visible == NULL || visible[start + j];
            for (int64_t r = 0; r < rows; r++) {
                float dot = 0.f;
                for (int64_t x = 0; x < d; x++) dot += q[r * d + x] * key[x];
                s[r * CHUNK + j] = shown ? dot * scale : -FLT_MAX;
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *row = s + r * CHUNK, top = m[r], sum = 0.f;
            for (int64_t j = 0; j < n; j++) top = row[j] > top ? row[j] : top;
            float rescale = expf(m[r] - top);
            for (int64_t x = 0; x < e; x++) acc[r * e + x] *= rescale;
            for (int64_t j = 0; j < n; j++) {
                row[j] = expf(row[j] - top);
                sum += row[j];
            }
            l[r] = l[r] * rescale + sum;
            m[r] = top;
        }
        for (int64_t j = 0; j < n; j++) {
            const float *value = v + (start + j) * vn;
            for (int64_t r = 0; r < rows; r++) {
                float w = s[r * CHUNK + j], *out = acc + r * e;
                for (int64_t x = 0; x < e; x++) out[x] += w * value[x];
            }
        }
    }
}

/* A running softmax of `rows` query rows starting empty: max, sum and accumulated values. */
static void start_rows(int64_t rows, int64_t e, float *m, float *l, float *acc) {
    for (int64_t r = 0; r < rows; r++) m[r] = -FLT_MAX, l[r] = 0.f;
    memset(acc, 0, sizeof(float) * rows * e);
}

/* Its outputs, each row's accumulated values over its sum, into `rows` consecutive rows of out. */
static void finish_rows(int64_t rows, int64_t e, const float *l, const float *acc, float *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < e; x++) out[r * e + x] = acc[r * e + x] / l[r];
}

/* Ask the memory system for `count` positions' keys and values ahead of their reading: a page chosen by index
 * starts where no hardware prefetcher can guess. */
static void prefetch_rows(const float *k, const float *v, int64_t count, int64_t kn, int64_t vn, int64_t d,
                          int64_t e) {
    for (int64_t j = 0; j < count; j++) {
        for (int64_t x = 0; x < d; x += 16) __builtin_prefetch(k + j * kn + x);
        for (int64_t x = 0; x < e; x += 16) __builtin_prefetch(v + j * vn + x);
    }
}

/* Quest's whole step for one new token at position t, in place: its key and value written into slot t, its key
 * folded into its page's max and min (the page's first key sets them), then per key/value head (b, g) and chooser
 * (each query head, R = H / G, or the group's mean bound, R = 1): the bound sum_d max(q_d hi_d, q_d lo_d) of every
 * ranked page [rank_from, rank_to), the `slots` best (the best first; row b reads its first budget[b] of them), the
 * first page when `keep_first` (and the step's own page is not it), the pages [whole_from, own) whole, and the own
 * page up to t, in one online softmax per query head.
 * q (B, H, D), k_new (B, G, D), v_new (B, G, E) contiguous; k, v buffers strided (b, g, position); bounds (b, g, page)
 * strided with [hi | lo] (2 D) contiguous; budget (B,); out (B, H, E). */
void quest_step(const float *q, const float *k_new, const float *v_new, float *k, float *v, float *bounds,
                const int64_t *budget, float *out, int64_t B, int64_t H, int64_t G, int64_t R, int64_t t,
                int64_t page, int64_t rank_from, int64_t rank_to, int64_t slots, int64_t keep_first,
                int64_t whole_from, int64_t D, int64_t E, int64_t kb, int64_t kg, int64_t kn, int64_t vb, int64_t vg,
                int64_t vn, int64_t bb, int64_t bg, int64_t bc, float scale, int threads) {
    int64_t group = H / G, own = t / page, ranked = rank_to > rank_from ? rank_to - rank_from : 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G;
        float *kh = k + b * kb + g * kg, *vh = v + b * vb + g * vg, *bh = bounds + b * bb + g * bg;
        memcpy(kh + t * kn, k_new + kv * D, sizeof(float) * D);
        memcpy(vh + t * vn, v_new + kv * E, sizeof(float) * E);
        float *hi = bh + own * bc, *lo = hi + D;
        const float *key = k_new + kv * D;
        for (int64_t x = 0; x < D; x++) {
            if (t % page == 0 || key[x] > hi[x]) hi[x] = key[x];
            if (t % page == 0 || key[x] < lo[x]) lo[x] = key[x];
        }
        float score[ranked > 0 ? ranked : 1];
        int64_t best[slots > 0 ? slots : 1];
        int64_t reads = slots < budget[b] ? slots : budget[b];
        for (int64_t r = 0; r < R; r++) {
            int64_t head0 = g * group + (R == 1 ? 0 : r), heads = R == 1 ? group : 1;
            for (int64_t p = 0; p < ranked; p++) {
                const float *phi = bh + (rank_from + p) * bc, *plo = phi + D;
                float total = 0.f;
                for (int64_t j = 0; j < heads; j++) {
                    const float *qh = q + (b * H + head0 + j) * D;
                    for (int64_t x = 0; x < D; x++) {
                        float a = qh[x] * phi[x], c = qh[x] * plo[x];
                        total += a > c ? a : c;
                    }
                }
                score[p] = total;
            }
            for (int64_t s = 0; s < reads; s++) { /* the best first, ties to the earlier page */
                int64_t arg = -1;
                for (int64_t p = 0; p < ranked; p++)
                    if (score[p] > -FLT_MAX && (arg < 0 || score[p] > score[arg])) arg = p;
                if (arg < 0) { reads = s; break; } /* no finite bound left (a query of NaN or inf) */
                best[s] = arg;
                score[arg] = -FLT_MAX;
            }
            int64_t row = b * H + head0;
            const float *qh = q + row * D;
            float m[heads], l[heads], acc[heads * E];
            start_rows(heads, E, m, l, acc);
            for (int64_t s = 1; s < reads; s++) /* in address order: neighbouring pages read as one stream */
                for (int64_t u = s; u > 0 && best[u] < best[u - 1]; u--) {
                    int64_t swap = best[u];
                    best[u] = best[u - 1], best[u - 1] = swap;
                }
            for (int64_t s = 0; s < reads; s++) {
                int64_t first = (rank_from + best[s]) * page;
                if (s + 1 < reads) /* the next page's keys and values on their way while this one is read */
                    prefetch_rows(kh + (rank_from + best[s + 1]) * page * kn, vh + (rank_from + best[s + 1]) * page * vn,
                                  page, kn, vn, D, E);
                fold_group(qh, heads, kh + first * kn, vh + first * vn, NULL, page, kn, vn, D, E, scale, m, l, acc);
            }
            if (keep_first && own > 0)
                fold_group(qh, heads, kh, vh, NULL, page, kn, vn, D, E, scale, m, l, acc);
            int64_t from = whole_from * page;
            fold_group(qh, heads, kh + from * kn, vh + from * vn, NULL, t + 1 - from, kn, vn, D, E, scale, m, l, acc);
            finish_rows(heads, E, l, acc, out + row * E);
        }
    }
}

/* One new token per query head against every position of its key/value head's buffer (softmax_step), its own key
 * and value (k_new (B, G, D), v_new (B, G, E) contiguous) written into position `slot` first (-1: already there):
 * q (B, H, D) contiguous, H / G query heads per key/value head; k, v strided (b, g, position), `count` positions; visible
 * (b, g, position) uint8 with strides (mb, mg, 1), or NULL; out (B, H, E). The positions of a head are cut into
 * `parts` ranges taken by different threads (so few heads still use every thread), merged by their log-sum-exp;
 * partial holds B * G * parts * (H / G) * (E + 2) floats. */
void softmax_step(const float *q, float *k, float *v, const float *k_new, const float *v_new, int64_t slot,
                  const uint8_t *visible, float *out, float *partial, int64_t B, int64_t H, int64_t G, int64_t count,
                  int64_t D, int64_t E, int64_t kb, int64_t kg, int64_t kn, int64_t vb, int64_t vg, int64_t vn,
                  int64_t mb, int64_t mg, int64_t parts, float scale, int threads) {
    int64_t rows = H / G, width = rows * (E + 2);
    for (int64_t kv = 0; slot >= 0 && kv < B * G; kv++) { /* the new token's key and value into their slot first */
        memcpy(k + (kv / G) * kb + (kv % G) * kg + slot * kn, k_new + kv * D, sizeof(float) * D);
        memcpy(v + (kv / G) * vb + (kv % G) * vg + slot * vn, v_new + kv * E, sizeof(float) * E);
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < B * G * parts; task++) {
        int64_t kv = task / parts, part = task % parts, b = kv / G, g = kv % G;
        int64_t from = count * part / parts, to = count * (part + 1) / parts;
        float *m = partial + task * width, *l = m + rows, *acc = l + rows;
        start_rows(rows, E, m, l, acc);
        const uint8_t *shown = visible == NULL ? NULL : visible + b * mb + g * mg + from;
        fold_group(q + (b * H + g * rows) * D, rows, k + b * kb + g * kg + from * kn, v + b * vb + g * vg + from * vn,
                   shown, to - from, kn, vn, D, E, scale, m, l, acc);
    }
    for (int64_t kv = 0; kv < B * G; kv++) {
        for (int64_t r = 0; r < rows; r++) {
            float top = -FLT_MAX, total = 0.f, *o = out + (kv * rows + r) * E;
            for (int64_t part = 0; part < parts; part++) {
                float mp = partial[(kv * parts + part) * width + r];
                top = mp > top ? mp : top;
            }
            memset(o, 0, sizeof(float) * E);
            for (int64_t part = 0; part < parts; part++) {
                float *m = partial + (kv * parts + part) * width, *l = m + rows, *acc = l + rows;
                float w = expf(m[r] - top);
                total += l[r] * w;
                for (int64_t x = 0; x < E; x++) o[x] += acc[r * E + x] * w;
            }
            for (int64_t x = 0; x < E; x++) o[x] /= total;
        }
    }
}

/* H2O's step (HeavyHitterCache.step) for each key/value head (b, g): the new key and value written into ring slot
 * `slot` (its mass 0), every query head of the group attends to the S slots (visible (b, g, S) uint8 leaves empty
 * slots out; NULL once every slot is filled), the group's mean weight added to each slot's mass, then the position
 * in ring slot `source` (leaving the window; -1: none) takes the heavy slot of least mass among [0, heavy) where it
 * has more (the first such slot on ties), keys, values and mass. q (B, H, D), k_new (B, G, D), v_new (B, G, E)
 * contiguous; keys, values strided (b, g, slot); mass (B, G, S) contiguous; out (B, H, E). */
void h2o_step(const float *q, const float *k_new, const float *v_new, float *k, float *v, float *mass,
              const uint8_t *visible, float *out, int64_t B, int64_t H, int64_t G, int64_t S, int64_t slot,
              int64_t source, int64_t heavy, int64_t D, int64_t E, int64_t kb, int64_t kg, int64_t kn, int64_t vb,
              int64_t vg, int64_t vn, float scale, int threads) {
    int64_t rows = H / G;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G;
        float *kh = k + b * kb + g * kg, *vh = v + b * vb + g * vg, *mh = mass + kv * S;
        const uint8_t *shown = visible == NULL ? NULL : visible + kv * S;
        memcpy(kh + slot * kn, k_new + kv * D, sizeof(float) * D);
        memcpy(vh + slot * vn, v_new + kv * E, sizeof(float) * E);
        mh[slot] = 0.f;
        float w[rows * S], top[rows], sum[rows];
        const float *qg = q + (b * H + g * rows) * D;
        for (int64_t r = 0; r < rows; r++) top[r] = -FLT_MAX, sum[r] = 0.f;
        for (int64_t j = 0; j < S; j++) {
            const float *key = kh + j * kn;
            int seen = shown == NULL || shown[j];
            for (int64_t r = 0; r < rows; r++) {
                float dot = 0.f;
                for (int64_t x = 0; x < D; x++) dot += qg[r * D + x] * key[x];
                w[r * S + j] = seen ? dot * scale : -FLT_MAX;
                top[r] = w[r * S + j] > top[r] ? w[r * S + j] : top[r];
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t j = 0; j < S; j++) {
                w[r * S + j] = expf(w[r * S + j] - top[r]);
                sum[r] += w[r * S + j];
            }
            for (int64_t j = 0; j < S; j++) w[r * S + j] /= sum[r];
        }
        float acc[rows * E];
        memset(acc, 0, sizeof(float) * rows * E);
        for (int64_t j = 0; j < S; j++) {
            const float *value = vh + j * vn;
            float gained = 0.f;
            for (int64_t r = 0; r < rows; r++) {
                float weight = w[r * S + j], *o = acc + r * E;
                gained += weight;
                for (int64_t x = 0; x < E; x++) o[x] += weight * value[x];
            }
            if (shown == NULL || shown[j]) mh[j] += gained / rows;
        }
        for (int64_t r = 0; r < rows; r++) memcpy(out + (b * H + g * rows + r) * E, acc + r * E, sizeof(float) * E);
        if (source >= 0 && heavy > 0) {
            int64_t weakest = 0;
            for (int64_t j = 1; j < heavy; j++) weakest = mh[j] < mh[weakest] ? j : weakest;
            if (mh[source] > mh[weakest]) {
                memcpy(kh + weakest * kn, kh + source * kn, sizeof(float) * D);
                memcpy(vh + weakest * vn, vh + source * vn, sizeof(float) * E);
                mh[weakest] = mh[source];
            }
        }
    }
}

/* KIVI's step read (QuantizedCache.attend, one token): each key/value head's query rows (q, H / G per head) against
 * its `keys` quantized keys (codes packed `bits` to a byte along the channels, the low bits first; a scale and a
 * zero point per channel and group of `group` tokens), its key residual and the new key (full precision, `kres`
 * positions in all, the new one last), then the weighted values: `values` quantized (per token, a scale and zero per
 * group of `group` channels, `group` a multiple of the codes a byte holds) and the value residual with the new
 * value (`vres` in all). Codes are read as they lie, never unpacked into a row: channel x = i * per + sub is bits
 * `sub * bits` of byte i, so the query (and the values' sums) are kept sub-major, q'[sub][i] = q[i * per + sub],
 * and every product runs over the bytes i. score = sum_x (q_x scale_x) code_x + sum_x q_x zero_x, a token group's
 * q * scale formed once; out_x = sum_j (w_j scale_j,y(x) code_j,x + w_j zero_j,y(x)), each term a value as the
 * eager form dequantizes it (no sum of zeros apart: it would cancel against the codes' sum). Scores are kept in
 * `scratch` (B * H * (keys + kres) floats). Layouts: q (B, H, D) contiguous; kc (b, g, n, ceil(D / per)), ks, kz
 * (b, g, n / group, D), vc (b, g, n, ceil(E / per)), vs, vz (b, g, n, ceil(E / group)), kr (b, g, kres, D), vr
 * (b, g, vres, E): each contiguous in its last axis, strides (b, g, position) given in order; out (B, H, E). */
void kivi_step(const float *q, const uint8_t *kc, const float *ks, const float *kz, const float *kr, const uint8_t *vc,
               const float *vs, const float *vz, const float *vr, float *out, float *scratch, int64_t B, int64_t H,
               int64_t G, int64_t D, int64_t E, int64_t bits, int64_t group, int64_t keys, int64_t kres,
               int64_t values, int64_t vres, const int64_t *strides, float scale, int threads) {
    int64_t rows = H / G, n = keys + kres, per = 8 / bits;
    int mask = (1 << bits) - 1; /* 32-bit: the byte-to-float conversions vectorise */
    int64_t kbytes = (D + per - 1) / per, vbytes = (E + per - 1) / per, vgroups = (E + group - 1) / group;
    int64_t span = group / per; /* the bytes of one value group */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G;
        const int64_t *st = strides;
#define AT(p, i) ((p) + b * st[3 * (i)] + g * st[3 * (i) + 1])
        const uint8_t *kch = AT(kc, 0), *vch = AT(vc, 4);
        const float *ksh = AT(ks, 1), *kzh = AT(kz, 2), *krh = AT(kr, 3), *vsh = AT(vs, 5), *vzh = AT(vz, 6);
        const float *vrh = AT(vr, 7);
#undef AT
        const float *qg = q + (b * H + g * rows) * D;
        float *s = scratch + (b * H + g * rows) * n;
        float qs[rows * per * kbytes], qz[rows];
        memset(qs, 0, sizeof(qs));
        for (int64_t j = 0; j < keys; j++) {
            if (j % group == 0) { /* a new token group: q * its channels' scales, sub-major, and q . its zeros */
                const float *sc = ksh + (j / group) * st[5], *ze = kzh + (j / group) * st[8];
                for (int64_t r = 0; r < rows; r++) {
                    float z = 0.f;
                    for (int64_t x = 0; x < D; x++) z += qg[r * D + x] * ze[x];
                    qz[r] = z * scale;
                    for (int64_t sub = 0; sub < per; sub++)
                        for (int64_t i = 0, x = sub; i < kbytes && x < D; i++, x += per)
                            qs[(r * per + sub) * kbytes + i] = qg[r * D + x] * sc[x] * scale;
                }
            }
            const uint8_t *code = kch + j * st[2];
            for (int64_t r = 0; r < rows; r++) {
                float dot = qz[r];
                for (int64_t sub = 0; sub < per; sub++) {
                    const float *qsub = qs + (r * per + sub) * kbytes;
                    int shift = (int)(sub * bits);
                    for (int64_t i = 0; i < kbytes; i++) dot += qsub[i] * (float)((code[i] >> shift) & mask);
                }
                s[r * n + j] = dot;
            }
        }
        for (int64_t j = 0; j < kres; j++) {
            const float *key = krh + j * st[11];
            for (int64_t r = 0; r < rows; r++) {
                float dot = 0.f;
                for (int64_t x = 0; x < D; x++) dot += qg[r * D + x] * key[x];
                s[r * n + keys + j] = dot * scale;
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float top = -FLT_MAX, sum = 0.f, *row = s + r * n;
            for (int64_t j = 0; j < n; j++) top = row[j] > top ? row[j] : top;
            for (int64_t j = 0; j < n; j++) {
                row[j] = expf(row[j] - top);
                sum += row[j];
            }
            for (int64_t j = 0; j < n; j++) row[j] /= sum;
        }
        float acc[rows * per * vbytes];
        memset(acc, 0, sizeof(acc));
        for (int64_t j = 0; j < values; j++) {
            const uint8_t *restrict code = vch + j * st[14];
            const float *sc = vsh + j * st[17], *ze = vzh + j * st[20];
            for (int64_t r = 0; r < rows; r++) {
                float w = s[r * n + j], a[vbytes], z[vbytes]; /* w * the scale and zero of each byte's group */
                for (int64_t y = 0; y < vgroups; y++) {
                    int64_t to = (y + 1) * span < vbytes ? (y + 1) * span : vbytes;
                    for (int64_t i = y * span; i < to; i++) a[i] = w * sc[y], z[i] = w * ze[y];
                }
                for (int64_t sub = 0; sub < per; sub++) { /* w * (code scale + zero): each value as eager reads it */
                    float *restrict o = acc + (r * per + sub) * vbytes;
                    int shift = (int)(sub * bits);
                    for (int64_t i = 0; i < vbytes; i++) o[i] += a[i] * (float)((code[i] >> shift) & mask) + z[i];
                }
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + (b * H + g * rows + r) * E;
            for (int64_t sub = 0; sub < per; sub++)
                for (int64_t i = 0, x = sub; i < vbytes && x < E; i++, x += per)
                    o[x] = acc[(r * per + sub) * vbytes + i];
            for (int64_t j = 0; j < vres; j++) {
                const float *value = vrh + j * st[23];
                float w = s[r * n + (n - vres) + j];
                for (int64_t x = 0; x < E; x++) o[x] += w * value[x];
            }
        }
    }
}

/* A head-wise (ragged) cache's step (RaggedCache.attend, one token): each key/value head (b, g) keeps its own number
 * of the prompt's positions, packed head after head (keys (P, D), values (P, E), head kv's from offsets[kv] to
 * offsets[kv + 1]), and every head the same `count` tokens after the prompt in buffers strided (b, g, position), the
 * new token written into position count - 1 of them first (k_new (B, G, D), v_new (B, G, E)). The group's query rows
 * read their head's packed part, then its appended part, in one online softmax. q (B, H, D); out (B, H, E). */
void ragged_step(const float *q, const float *keys, const float *values, const int64_t *offsets, float *k, float *v,
                 const float *k_new, const float *v_new, float *out, int64_t B, int64_t H, int64_t G, int64_t count,
                 int64_t D, int64_t E, int64_t kb, int64_t kg, int64_t kn, int64_t vb, int64_t vg, int64_t vn,
                 float scale, int threads) {
    int64_t rows = H / G;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G, start = offsets[kv], kept = offsets[kv + 1] - start;
        float *kh = k + b * kb + g * kg, *vh = v + b * vb + g * vg;
        memcpy(kh + (count - 1) * kn, k_new + kv * D, sizeof(float) * D);
        memcpy(vh + (count - 1) * vn, v_new + kv * E, sizeof(float) * E);
        const float *qg = q + (b * H + g * rows) * D;
        float m[rows], l[rows], acc[rows * E];
        start_rows(rows, E, m, l, acc);
        fold_group(qg, rows, keys + start * D, values + start * E, NULL, kept, D, E, D, E, scale, m, l, acc);
        fold_group(qg, rows, kh, vh, NULL, count, kn, vn, D, E, scale, m, l, acc);
        finish_rows(rows, E, l, acc, out + (b * H + g * rows) * E);
    }
}

/* One token against positions whose keys lie in two buffers of different widths, one softmax over both (ThinK's
 * ChannelCache.attend): the first n1 positions' keys k1 (c channels each, read with q1, the query on those channels,
 * (B, G, H / G, c) contiguous), the next n2 positions' keys k2 (D channels, read with q (B, H, D)), and values v of
 * all n1 + n2 positions in order; strides (b, g, position) for k1, k2, v; out (B, H, E). */
void two_keys_step(const float *q1, const float *q, const float *k1, const float *k2, const float *v, float *out,
                   int64_t B, int64_t H, int64_t G, int64_t C, int64_t D, int64_t E, int64_t n1, int64_t n2,
                   int64_t ab, int64_t ag, int64_t an, int64_t kb, int64_t kg, int64_t kn, int64_t vb, int64_t vg,
                   int64_t vn, float scale, int threads) {
    int64_t rows = H / G;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G;
        const float *vh = v + b * vb + g * vg;
        float m[rows], l[rows], acc[rows * E];
        start_rows(rows, E, m, l, acc);
        fold_group(q1 + kv * rows * C, rows, k1 + b * ab + g * ag, vh, NULL, n1, an, vn, C, E, scale, m, l, acc);
        fold_group(q + (b * H + g * rows) * D, rows, k2 + b * kb + g * kg, vh + n1 * vn, NULL, n2, kn, vn, D, E, scale,
                   m, l, acc);
        finish_rows(rows, E, l, acc, out + (b * H + g * rows) * E);
    }
}

#define PART_FIELDS 12 /* k, v, count, k strides (b, g, position), v strides, visible, its strides (b, g) */

/* One token per query head against several runs of positions under one softmax (softmax_over_parts): `nparts` runs,
 * each described by PART_FIELDS int64 in `parts`: its keys' and values' addresses, its position count, the keys'
 * strides (b, g, position) and the values', and a visible (b, g, position) uint8 address (0: every position) with
 * its strides (b, g; position stride 1). q (B, H, D); out (B, H, E). */
void parts_step(const float *q, const int64_t *parts, int64_t nparts, float *out, int64_t B, int64_t H, int64_t G,
                int64_t D, int64_t E, float scale, int threads) {
    int64_t rows = H / G;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t kv = 0; kv < B * G; kv++) {
        int64_t b = kv / G, g = kv % G;
        float m[rows], l[rows], acc[rows * E];
        start_rows(rows, E, m, l, acc);
        for (int64_t p = 0; p < nparts; p++) {
            const int64_t *f = parts + p * PART_FIELDS;
            const float *k = (const float *)f[0] + b * f[3] + g * f[4], *v = (const float *)f[1] + b * f[6] + g * f[7];
            const uint8_t *shown = f[9] ? (const uint8_t *)f[9] + b * f[10] + g * f[11] : NULL;
            fold_group(q + (b * H + g * rows) * D, rows, k, v, shown, f[2], f[5], f[8], D, E, scale, m, l, acc);
        }
        finish_rows(rows, E, l, acc, out + (b * H + g * rows) * E);
    }
}
