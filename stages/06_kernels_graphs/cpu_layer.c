/* A whole decoder layer in one call: the fused model's layer (fused_model.py) with nothing
 * between its parts but C. For every step where torch's MKL is found (see set_sgemm), else for
 * steps of a few rows (a single stream's decode, a speculative verification, a small batch).
 *
 * Why: with one row a layer's four matrix-vector products take ~0.6 ms on our 2-core CPU,
 * and the ten or so Python calls around them (norms, RoPE, the KV write, attention, SiLU,
 * the module calls and views) another ~0.2 ms: a fifth of the step. Here the Python side
 * makes one call per layer. The products are this file's GEMV (each thread streams its share
 * of the weight rows once, four rows at a time; float32 weights, or int8_linear.py's int8
 * ones widened in registers); the rest is cpu_ops.c and cpu_attention.c,
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

/* Past a few rows a matrix product is compute-bound, and a BLAS GEMM with its packing and
 * cache blocking beats this file's GEMV: torch's CPU build ships MKL's sgemm_, whose address
 * the Python side hands over (set_sgemm). Without it, only steps of few_rows or fewer come here. */
typedef void (*sgemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);
static sgemm_fn blas_sgemm = NULL;
static int64_t few_rows = 8;

void set_sgemm(void *fn, int64_t rows)
{
    blas_sgemm = (sgemm_fn)fn;
    few_rows = rows;
}

/* Weight i of a row, as a float: float32 weights, or int8 ones (int8 is the row's type). */
static inline float weight_at(const void *row, int int8, int64_t i)
{
    return int8 ? (float)((const int8_t *)row)[i] : ((const float *)row)[i];
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VECTOR_DOT 1
/* 16 weights of a row from `i` on, as floats (int8 ones widened in registers). */
static inline __m512 weights16(const void *row, int int8, int64_t i, __mmask16 mask)
{
    if (int8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, (const int8_t *)row + i)));
    return _mm512_maskz_loadu_ps(mask, (const float *)row + i);
}
#endif

/* Four weight rows (w0 and the next three, k weights each) times one activation row:
 * out[c] = sum_i x[i] * w_c[i]. Each load of x serves four rows; every weight byte is read once. */
static void dot4(const float *x, const void *w0, int int8, int64_t k, float *out)
{
    const int64_t stride = int8 ? k : k * (int64_t)sizeof(float);
    const char *rows[4] = {(const char *)w0, (const char *)w0 + stride, (const char *)w0 + 2 * stride,
                           (const char *)w0 + 3 * stride};
#ifdef VECTOR_DOT
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 mask = k - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i);
        for (int c = 0; c < 4; c++) acc[c] = _mm512_fmadd_ps(xv, weights16(rows[c], int8, i, mask), acc[c]);
    }
    for (int c = 0; c < 4; c++) out[c] = _mm512_reduce_add_ps(acc[c]);
#else
    for (int c = 0; c < 4; c++) {
        float s = 0.f;
        for (int64_t i = 0; i < k; i++) s += x[i] * weight_at(rows[c], int8, i);
        out[c] = s;
    }
#endif
}

/* y[r, j] = scale[j] * sum_i x[r, i] * w[j, i] for r < m, j < n: x [m, k], w [n, k] (a Linear's
 * weight: float32 with scale NULL, or int8 with one float scale per row, int8_linear.py's
 * format), y [m, n]. Each thread streams its share of the weight rows, four at a time. */
static void product(const float *x, const void *w, const float *scale, float *y, int64_t m, int64_t n, int64_t k,
                    int num_threads)
{
    if (!scale && m > few_rows && blas_sgemm) {  /* many rows: y^T = W x^T, column-major for BLAS */
        const int ni = (int)n, mi = (int)m, ki = (int)k;
        const float one = 1.f, zero = 0.f;
        blas_sgemm("T", "N", &ni, &mi, &ki, &one, (const float *)w, &ki, x, &ki, &zero, y, &ni);
        return;
    }
    const int64_t quads = n / 4;
    #pragma omp parallel num_threads(num_threads)
    {
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < quads; b++)
            for (int64_t r = 0; r < m; r++) {
                float *out = y + r * n + 4 * b;
                dot4(x + r * k, scale ? (const void *)((const int8_t *)w + 4 * b * k)
                                      : (const void *)((const float *)w + 4 * b * k), scale != NULL, k, out);
                if (scale)
                    for (int c = 0; c < 4; c++) out[c] *= scale[4 * b + c];
            }
        #pragma omp for schedule(static)
        for (int64_t j = 4 * quads; j < n; j++)  /* the last n % 4 rows */
            for (int64_t r = 0; r < m; r++) {
                const void *row = scale ? (const void *)((const int8_t *)w + j * k) : (const void *)((const float *)w + j * k);
                float s = 0.f;
                for (int64_t i = 0; i < k; i++) s += x[r * k + i] * weight_at(row, scale != NULL, i);
                y[r * n + j] = scale ? s * scale[j] : s;
            }
    }
}

void gemv_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k, int num_threads)
{
    product(x, w, NULL, y, m, n, k, num_threads);
}

void gemv_i8_f32(const float *x, const int8_t *q, const float *scale, float *y, int64_t m, int64_t n, int64_t k,
                 int num_threads)
{
    product(x, q, scale, y, m, n, k, num_threads);
}

/* One decoder layer (pre-norm attention and SwiGLU MLP, fused_model.FusedLayer's math) for m
 * rows. x is the layer's input delta; residual the stream so far, or NULL before layer 0.
 * The four weights (QKV, o, gate-up, down) are float32, or int8 where scales[i] is not NULL.
 * Writes the stream after the attention half to residual_out (may be residual itself) and
 * the MLP's output, the next layer's delta, to x_out (may be x itself). The rows' new K/V go
 * to their slots in the layer's pools, then every row attends (rows/seqs/lens as in
 * paged_attention_rows_f32). scratch holds m * (2 * hidden + qkv + heads * dim + 3 * inter)
 * floats. Returns 0, or how many rows had a bad slot or block table (nothing is written or
 * read out of bounds for them). */
int64_t decoder_layer_f32(
    int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
    const float *x, const float *residual, float *residual_out, float *x_out,
    const float *input_norm, const void *qkv_w, const void *o_w, const float *post_norm,
    const void *gate_up_w, const void *down_w, const float *const scales[4], const float *cos, const float *sin,
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
    product(h, qkv_w, scales[0], qkv, m, qkv_width, hidden, num_threads);
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

    product(attn, o_w, scales[1], o, m, hidden, heads * dim, num_threads);
    add_rms_norm_f32(o, residual_out, residual_out, h, post_norm, m, hidden, eps, num_threads);
    product(h, gate_up_w, scales[2], gate_up, m, 2 * inter, hidden, num_threads);
    silu_mul_f32(gate_up, act, m, inter, num_threads);
    product(act, down_w, scales[3], x_out, m, hidden, inter, num_threads);
    return 0;
}
