/* A whole decoder layer in one call, for steps of a few rows (a single stream's decode, a
 * speculative verification, a small batch): the fused model's layer (fused_model.py) with
 * nothing between its parts but C.
 *
 * Why: with one row a layer's four matrix-vector products take ~0.6 ms on our 2-core CPU,
 * and the ten or so Python calls around them (norms, RoPE, the KV write, attention, SiLU,
 * the module calls and views) another ~0.2 ms: a fifth of the step. Here the Python side
 * makes one call per layer. The products are this file's GEMV (each thread streams its share
 * of the weight rows once, four rows at a time); the rest is cpu_ops.c and cpu_attention.c,
 * included below, so the layer computes what the per-op path computes, up to the order of
 * its sums.
 *
 * Compiled with -ffast-math, as cpu_attention.c needs (vectorized exp).
 */
#include <stdint.h>
#include <string.h>

#include "cpu_attention.c"
#include "cpu_ops.c"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* y[r, j] = sum_i x[r, i] * w[j, i] for r < m, j < n: x [m, k], w [n, k] (a Linear's weight),
 * y [m, n], all contiguous. Four weight rows per step of the loop, so each load of x serves
 * four of them; every weight byte is read once per call, which is what bounds it. */
void gemv_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k, int num_threads)
{
    const int64_t quads = n / 4;
    #pragma omp parallel num_threads(num_threads)
    {
        #pragma omp for schedule(static) nowait
        for (int64_t q = 0; q < quads; q++) {
            const float *w0 = w + 4 * q * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
            for (int64_t r = 0; r < m; r++) {
                const float *xr = x + r * k;
#ifdef __AVX512F__
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t i = 0; i < k; i += 16) {
                    const __mmask16 mask = k - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
                    const __m512 xv = _mm512_maskz_loadu_ps(mask, xr + i);
                    a0 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w0 + i), a0);
                    a1 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w1 + i), a1);
                    a2 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w2 + i), a2);
                    a3 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w3 + i), a3);
                }
                float *out = y + r * n + 4 * q;
                out[0] = _mm512_reduce_add_ps(a0);
                out[1] = _mm512_reduce_add_ps(a1);
                out[2] = _mm512_reduce_add_ps(a2);
                out[3] = _mm512_reduce_add_ps(a3);
#else
                float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
                #pragma omp simd reduction(+:s0, s1, s2, s3)
                for (int64_t i = 0; i < k; i++) {
                    s0 += xr[i] * w0[i]; s1 += xr[i] * w1[i]; s2 += xr[i] * w2[i]; s3 += xr[i] * w3[i];
                }
                float *out = y + r * n + 4 * q;
                out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
#endif
            }
        }
        #pragma omp for schedule(static)
        for (int64_t j = 4 * quads; j < n; j++)  /* the last n % 4 rows */
            for (int64_t r = 0; r < m; r++) {
                float s = 0.f;
                #pragma omp simd reduction(+:s)
                for (int64_t i = 0; i < k; i++) s += x[r * k + i] * w[j * k + i];
                y[r * n + j] = s;
            }
    }
}

/* One decoder layer (pre-norm attention and SwiGLU MLP, fused_model.FusedLayer's math) for m
 * rows. x is the layer's input delta; residual the stream so far, or NULL before layer 0.
 * Writes the stream after the attention half to residual_out (may be residual itself) and
 * the MLP's output, the next layer's delta, to x_out (may be x itself). The rows' new K/V go
 * to their slots in the layer's pools, then every row attends (rows/seqs/lens as in
 * paged_attention_rows_f32). scratch holds m * (2 * hidden + qkv + heads * dim + 3 * inter)
 * floats. Returns 0, or how many rows had a bad slot or block table (nothing is written or
 * read out of bounds for them). */
int64_t decoder_layer_f32(
    int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
    const float *x, const float *residual, float *residual_out, float *x_out,
    const float *input_norm, const float *qkv_w, const float *o_w, const float *post_norm,
    const float *gate_up_w, const float *down_w, const float *cos, const float *sin,
    float *k_pool, float *v_pool, int64_t num_blocks, int64_t block_size, const int64_t *slots,
    const int64_t *rows, const int64_t *seqs, const int64_t *lens, int64_t n_rows,
    const int64_t *block_tables, int64_t table_width, float *scratch, int num_threads)
{
    const int64_t qkv_width = (heads + 2 * kv_heads) * dim, kv_width = kv_heads * dim;
    float *h = scratch, *qkv = h + m * hidden, *attn = qkv + m * qkv_width, *o = attn + m * heads * dim;
    float *gate_up = o + m * hidden, *act = gate_up + m * 2 * inter;

    if (residual) {
        add_rms_norm_f32(x, residual, residual_out, h, input_norm, m, hidden, eps, num_threads);
    } else {
        memmove(residual_out, x, (size_t)(m * hidden) * sizeof(float));
        add_rms_norm_f32(x, NULL, NULL, h, input_norm, m, hidden, eps, num_threads);
    }
    gemv_f32(h, qkv_w, qkv, m, qkv_width, hidden, num_threads);
    rotary_f32(qkv, qkv_width, heads, qkv + heads * dim, qkv_width, kv_heads, cos, sin, m, dim / 2, num_threads);

    int64_t bad = 0;
    for (int64_t t = 0; t < m; t++) {  /* the KV write: row t's k and v into slot slots[t] */
        if (slots[t] < 0 || slots[t] >= num_blocks * block_size) { bad++; continue; }
        const float *k = qkv + t * qkv_width + heads * dim;
        memcpy(k_pool + slots[t] * kv_width, k, (size_t)kv_width * sizeof(float));
        memcpy(v_pool + slots[t] * kv_width, k + kv_width, (size_t)kv_width * sizeof(float));
    }
    if (bad) return bad;
    bad = paged_attention_rows_f32(qkv, qkv_width, attn, k_pool, v_pool, num_blocks, rows, seqs, lens, n_rows,
                                   block_tables, table_width, heads, kv_heads, dim, block_size,
                                   1.f / sqrtf((float)dim), num_threads);
    if (bad) return bad;

    gemv_f32(attn, o_w, o, m, hidden, heads * dim, num_threads);
    add_rms_norm_f32(o, residual_out, residual_out, h, post_norm, m, hidden, eps, num_threads);
    gemv_f32(h, gate_up_w, gate_up, m, 2 * inter, hidden, num_threads);
    silu_mul_f32(gate_up, act, m, inter, num_threads);
    gemv_f32(act, down_w, x_out, m, hidden, inter, num_threads);
    return 0;
}
