/* A whole decoder layer in one call: the fused model's layer (fused_model.py) with nothing
 * between its parts but C, for every step (one row or hundreds).
 *
 * Why: with one row a layer's four matrix-vector products take ~0.6 ms on our 2-core CPU,
 * and the ten or so Python calls around them (norms, RoPE, the KV write, attention, SiLU,
 * the module calls and views) another ~0.2 ms: a fifth of the step. Here the Python side
 * makes one call per layer. The products are this file's register-blocked kernel (each
 * thread streams its share of the weight rows once, four rows at a time, past which the
 * activation rows go four at a time), or MKL's sgemm for float32 steps of many rows; int8
 * weights (int8_linear.py's) go to int8.c's integer version where the CPU has VNNI or is an
 * AVX2-only one, else are widened to float in registers here. The rest is ops.c and attention.c, included
 * below, so the layer computes what the per-op path computes, up to the order of its sums
 * (and, with int8 on VNNI or AVX2, the rounding of activations to int16).
 *
 * Compiled with -ffast-math, as attention.c needs (vectorized exp).
 */
#include <stdint.h>
#include <string.h>

#define WROWS 4  /* a register block: WROWS weight rows by up to XROWS activation rows (see dot_block) */
#define XROWS 4
#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 2  /* how many weight blocks ahead a block's first pass prefetches (here, int8.c) */
#endif

#include "attention.c"
#include "int8.c"
#include "ops.c"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* Past ~100 rows a BLAS GEMM, with its packing and cache blocking over k, beats this file's
 * blocked kernel: torch's CPU build ships MKL's sgemm_, whose address the Python side hands over
 * (set_sgemm), with the rows past which to use it. Without it, the blocked kernel does all. */
typedef void (*sgemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);
static sgemm_fn blas_sgemm = NULL;
static int64_t blocked_rows = 64;

void set_sgemm(void *fn, int64_t rows)
{
    blas_sgemm = (sgemm_fn)fn;
    blocked_rows = rows;
}

/* Weight i of a row, as a float: float32 weights, or int8 ones (int8 is the row's type). */
static inline float weight_at(const void *row, int int8, int64_t i)
{
    return int8 ? (float)((const int8_t *)row)[i] : ((const float *)row)[i];
}

/* -DPLAIN_LOOPS: the plain-C loops below on any CPU (what a compiler makes of them alone; a
 * benchmark's baseline) */
#if defined(PLAIN_LOOPS)
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VECTOR_DOT 1
/* 16 floats from x[i] on (mask: those that exist). */
static inline __m512 floats16(const float *x, int64_t i, __mmask16 mask)
{
    return mask == (__mmask16)0xFFFF ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(mask, x + i);
}

/* 16 weights of a row from `i` on, as floats (int8 ones widened in registers). */
static inline __m512 weights16(const void *row, int int8, int64_t i, __mmask16 mask)
{
    if (!int8) return floats16((const float *)row, i, mask);
    const int8_t *q = (const int8_t *)row + i;
    const __m128i bytes = mask == (__mmask16)0xFFFF ? _mm_loadu_si128((const __m128i *)q) : _mm_maskz_loadu_epi8(mask, q);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VECTOR_DOT 1
#define DOT_AVX2 1  /* the Zen 3 hosts' instructions: 8 floats a vector, 16 vector registers */

/* 8 weights of a row from `i` on, as floats (int8 ones widened in registers). */
static inline __m256 weights8(const void *row, int int8, int64_t i)
{
    if (!int8) return _mm256_loadu_ps((const float *)row + i);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
}

static inline float sum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

/* A block of the product: rw weight rows (from w, `stride` bytes apart) times rx activation
 * rows (from x, k floats apart): y[r * ldy + c] = sum_i x[r, i] * w_c[i].
 *
 * Why blocks: one activation row's dot products use each weight vector once, and their few
 * sums each wait on their last multiply-add (4 cycles): past a couple of rows the loop, not
 * memory, is the limit (1.3-1.5x slower than MKL at 32 rows). Here each weight vector
 * loaded serves rx rows and each activation vector rw weight rows, and the rw * rx sums are
 * independent: enough to keep both FMA units of a core busy. The weight block (4 rows, at
 * most 24 KB) stays in L1 while the activation rows pass over it, so each weight byte comes
 * from memory once a step whatever its rows. 4 x 4 measured as well as 4 x 5, 4 x 6, 5 x 4
 * (bench_cpu_kernels.py, 8-128 rows). Always inlined with constant rw, rx and int8, so the
 * compiler keeps the sums in registers; whole vectors use plain loads, since a masked load
 * costs an extra uop (the masked loop was 1.3x slower). */

#if defined(VECTOR_DOT) && !defined(DOT_AVX2)
static inline __attribute__((always_inline)) void dot_block(const float *x, const char *w, int64_t stride,
                                                            const int int8, int64_t k, float *y, int64_t ldy,
                                                            const int rw, const int rx, int first)
{
    __m512 acc[WROWS][XROWS], wv[WROWS];
    #pragma GCC unroll 4
    for (int c = 0; c < rw; c++)
        #pragma GCC unroll 4
        for (int r = 0; r < rx; r++) acc[c][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        /* whole vectors, then the last k % 16 (the loop is split, so whole ones use plain loads) */
        const __mmask16 mask = i + 16 <= k ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        if (first && (i * (int8 ? 1 : 4) & 63) == 0)  /* the weights' first pass: rows two blocks on, on their way */
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++)
                _mm_prefetch(w + (PREFETCH_BLOCKS * WROWS + c) * stride + i * (int8 ? 1 : 4), _MM_HINT_T0);
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) wv[c] = weights16(w + c * stride, int8, i, mask);
        #pragma GCC unroll 4
        for (int r = 0; r < rx; r++) {
            const __m512 xv = floats16(x + r * k, i, mask);
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) acc[c][r] = _mm512_fmadd_ps(xv, wv[c], acc[c][r]);
        }
    }
    if (rw == 4 && rx == 4) {  /* a whole block: its 16 sums finished together */
        __m512 parts[16];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++) parts[4 * r + c] = acc[c][r];
        store_sums_4x4(parts, y, ldy);
        return;
    }
    #pragma GCC unroll 4
    for (int r = 0; r < rx; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) y[r * ldy + c] = _mm512_reduce_add_ps(acc[c][r]);
}

#elif defined(DOT_AVX2)
/* dot_block for AVX2, on at most two activation rows: a 4 x 2 block of sums (8 registers), its
 * 4 weight vectors and a row's fit AVX2's 16 (4 x 4 would spill); the last k % 8 one by one. */
static inline __attribute__((always_inline)) void dot_pair(const float *x, const char *w, int64_t stride,
                                                           const int int8, int64_t k, float *y, int64_t ldy,
                                                           const int rw, const int rx, int first)
{
    __m256 acc[WROWS][2], wv[WROWS];
    #pragma GCC unroll 4
    for (int c = 0; c < rw; c++)
        #pragma GCC unroll 2
        for (int r = 0; r < rx; r++) acc[c][r] = _mm256_setzero_ps();
    const int64_t whole = k & ~(int64_t)7;
    for (int64_t i = 0; i < whole; i += 8) {
        if (first && (i * (int8 ? 1 : 4) & 63) == 0)  /* the weights' first pass: rows two blocks on, on their way */
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++)
                _mm_prefetch(w + (PREFETCH_BLOCKS * WROWS + c) * stride + i * (int8 ? 1 : 4), _MM_HINT_T0);
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) wv[c] = weights8(w + c * stride, int8, i);
        #pragma GCC unroll 2
        for (int r = 0; r < rx; r++) {
            const __m256 xv = _mm256_loadu_ps(x + r * k + i);
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) acc[c][r] = _mm256_fmadd_ps(xv, wv[c], acc[c][r]);
        }
    }
    #pragma GCC unroll 2
    for (int r = 0; r < rx; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) {
            float sum = sum8(acc[c][r]);
            for (int64_t i = whole; i < k; i++) sum += x[r * k + i] * weight_at(w + c * stride, int8, i);
            y[r * ldy + c] = sum;
        }
}

static inline __attribute__((always_inline)) void dot_block(const float *x, const char *w, int64_t stride,
                                                            const int int8, int64_t k, float *y, int64_t ldy,
                                                            const int rw, const int rx, int first)
{
    dot_pair(x, w, stride, int8, k, y, ldy, rw, rx < 2 ? rx : 2, first);
    if (rx > 2) dot_pair(x + 2 * k, w, stride, int8, k, y + 2 * ldy, ldy, rw, rx - 2, 0);
}
#endif

#ifdef VECTOR_DOT
/* dot_block with int8, rw (WROWS, or 1 for the last n % WROWS weight rows) and rx (1..XROWS)
 * as compile-time constants: one copy of the loop per case. */
static void dot_block_any(const float *x, const char *w, int64_t stride, int int8, int64_t k, float *y, int64_t ldy,
                          int rw, int rx, int first)
{
#define ROWS_CASE(I8, RW, RX) case RX: dot_block(x, w, stride, I8, k, y, ldy, RW, RX, first); return;
#define ALL_ROWS(I8, RW) switch (rx) { ROWS_CASE(I8, RW, 1) ROWS_CASE(I8, RW, 2) ROWS_CASE(I8, RW, 3) \
                                       ROWS_CASE(I8, RW, 4) }
    if (int8) {
        if (rw == WROWS) { ALL_ROWS(1, WROWS) } else { ALL_ROWS(1, 1) }
    } else {
        if (rw == WROWS) { ALL_ROWS(0, WROWS) } else { ALL_ROWS(0, 1) }
    }
#undef ALL_ROWS
#undef ROWS_CASE
}
#else
static void dot_block_any(const float *x, const char *w, int64_t stride, int int8, int64_t k, float *y, int64_t ldy,
                          int rw, int rx, int first)
{
    (void)first;
    for (int r = 0; r < rx; r++)
        for (int c = 0; c < rw; c++) {
            float s = 0.f;
            for (int64_t i = 0; i < k; i++) s += x[r * k + i] * weight_at(w + c * stride, int8, i);
            y[r * ldy + c] = s;
        }
}
#endif

/* One block by the kernel its weights take: int8.c's integer one where the rows come
 * rounded to int16 (xq), else dot_block's float one. */
static inline void product_block(const float *x, const int16_t *xq, int64_t k_padded, const char *w, int64_t stride,
                                 int int8, int64_t k, float *y, int64_t ldy, int rw, int rx, int first)
{
#ifdef INT16_ROWS
    if (xq) {
        dot_block_int16_any(xq, k_padded, (const int8_t *)w, k, y, ldy, rw, rx, first);
        return;
    }
#endif
    (void)xq, (void)k_padded;
    dot_block_any(x, w, stride, int8, k, y, ldy, rw, rx, first);
}

/* y[r, j] = scale[j] * sum_i x[r, i] * w[j, i] for r < m, j < n: x [m, k], w [n, k] (a Linear's
 * weight: float32 with scale NULL, or int8 with one float scale per row, int8_linear.py's
 * format), y [m, n]. Each thread takes its share of the weight rows, WROWS at a time, and runs
 * every activation row past them in blocks of at most XROWS, of even sizes (10 = 4+3+3). */
static void product(const float *x, const void *w, const float *scale, float *y, int64_t m, int64_t n, int64_t k,
                    int num_threads)
{
    if (!scale && m > blocked_rows && blas_sgemm) {  /* many rows: y^T = W x^T, column-major for BLAS */
        const int ni = (int)n, mi = (int)m, ki = (int)k;
        const float one = 1.f, zero = 0.f;
        blas_sgemm("T", "N", &ni, &mi, &ki, &one, (const float *)w, &ki, x, &ki, &zero, y, &ni);
        return;
    }
    const int int8 = scale != NULL;
    const int16_t *xq = NULL;  /* int8 weights on VNNI or AVX2: the rows rounded to int16, with their scales */
    const float *rscale = NULL;
    int64_t k_padded = 0;
#ifdef INT16_ROWS
    if (int8 && int16_rows(x, m, k, &xq, &rscale, &k_padded) != 0) xq = NULL;  /* no buffer: widen to float */
#endif
    const int64_t stride = int8 ? k : k * (int64_t)sizeof(float), row_blocks = (m + XROWS - 1) / XROWS;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t j = 0; j < n; j += WROWS) {
        const int rw = n - j >= WROWS ? WROWS : (int)(n - j);
        for (int64_t b = 0, r = 0; b < row_blocks; b++) {
            const int rx = (int)(m / row_blocks + (b < m % row_blocks));
            const int16_t *rows_q = xq ? xq + r * k_padded : NULL;
            if (rw == WROWS)
                product_block(x + r * k, rows_q, k_padded, (const char *)w + j * stride, stride, int8, k, y + r * n + j,
                              n, WROWS, rx, b == 0);
            else  /* the last n % WROWS weight rows, one at a time */
                for (int c = 0; c < rw; c++)
                    product_block(x + r * k, rows_q, k_padded, (const char *)w + (j + c) * stride, stride, int8, k,
                                  y + r * n + j + c, n, 1, rx, b == 0);
            r += rx;
        }
        if (scale)
            for (int64_t r = 0; r < m; r++)
                for (int c = 0; c < rw; c++) y[r * n + j + c] *= xq ? rscale[r] * scale[j + c] : scale[j + c];
    }
}

void product_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k, int num_threads)
{
    product(x, w, NULL, y, m, n, k, num_threads);
}

void product_i8_f32(const float *x, const int8_t *q, const float *scale, float *y, int64_t m, int64_t n, int64_t k,
                    int num_threads)
{
    product(x, q, scale, y, m, n, k, num_threads);
}

/* One decoder layer (pre-norm attention and SwiGLU MLP, fused_model.FusedLayer's math) for m
 * rows. x is the layer's input delta; residual the stream so far, or NULL before layer 0.
 * The four weights (QKV, o, gate-up, down) are float32, or int8 where scales[i] is not NULL;
 * q_norm and k_norm ([dim] each, Qwen3's per-head norms before RoPE) or NULL.
 * Writes the stream after the attention half to residual_out (may be residual itself) and
 * the MLP's output, the next layer's delta, to x_out (may be x itself). The rows' new K/V go
 * to their slots in the layer's pools, then every row attends (rows/seqs/lens, a tree's
 * tree_first/tree_bits and the layer's sliding window, 0 for none, as in
 * paged_attention_rows_f32; no sinks: the models this layer serves have none). scratch holds
 * m * (2 * hidden + qkv + heads * dim + 3 * inter) floats. Returns 0, or how many rows had a
 * bad slot or block table (nothing is written or read out of bounds for them). */
int64_t decoder_layer_f32(
    int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
    const float *x, const float *residual, float *residual_out, float *x_out,
    const float *input_norm, const void *qkv_w, const void *o_w, const float *post_norm,
    const float *q_norm, const float *k_norm, const void *gate_up_w, const void *down_w, const float *const scales[4], const float *cos, const float *sin,
    void *k_pool, void *v_pool, int kv_kind, uint8_t *k_scale, uint8_t *v_scale,  /* as attention.c's */
    int64_t num_blocks, int64_t block_size, const int64_t *slots,
    const int64_t *rows, const int64_t *seqs, const int64_t *lens, int64_t n_rows,
    const int64_t *tree_first, const uint64_t *tree_bits, int64_t window,
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
    if (q_norm) {
        head_rms_norm_f32(qkv, qkv_width, heads, q_norm, m, dim, eps, num_threads);
        head_rms_norm_f32(qkv + heads * dim, qkv_width, kv_heads, k_norm, m, dim, eps, num_threads);
    }
    rotary_f32(qkv, qkv_width, heads, qkv + heads * dim, qkv_width, kv_heads, cos, sin, m, dim / 2, num_threads);

    int64_t bad = 0;
    for (int64_t t = 0; t < m; t++) {  /* the KV write: row t's k and v into slot slots[t] */
        if (slots[t] < 0 || slots[t] >= num_blocks * block_size) { bad++; continue; }
        const float *k = qkv + t * qkv_width + heads * dim;
        store_kv_row(k_pool, k_scale, kv_kind, slots[t], k, kv_heads, dim);
        store_kv_row(v_pool, v_scale, kv_kind, slots[t], k + kv_width, kv_heads, dim);
    }
    if (bad) return bad;
    bad = paged_attention_rows_f32(qkv, qkv_width, attn, k_pool, v_pool, kv_kind, k_scale, v_scale, num_blocks, rows, seqs, lens, n_rows,
                                   tree_first, tree_bits, window, NULL, block_tables, table_width, heads, kv_heads, dim, block_size,
                                   1.f / sqrtf((float)dim), num_threads);
    if (bad) return bad;

    product(attn, o_w, scales[1], o, m, hidden, heads * dim, num_threads);
    add_rms_norm_f32(o, residual_out, residual_out, h, post_norm, m, hidden, eps, num_threads);
    product(h, gate_up_w, scales[2], gate_up, m, 2 * inter, hidden, num_threads);
    silu_mul_f32(gate_up, act, m, inter, num_threads);
    product(act, down_w, scales[3], x_out, m, hidden, inter, num_threads);
    return 0;
}
