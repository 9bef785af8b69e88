/* int8 weights times float32 activations with integer multiply-adds (AVX-512 VNNI, or AVX2's
 * vpmaddwd), for layer.c's product(). Included by it, after its block sizes and attention.c
 * (store_sums_4x4).
 *
 * Why: widening each int8 weight to float32 takes two conversions per 16 weights before the
 * multiply-add can use it, so at one row the widening, not memory, bounds the product (~13
 * GB/s of int8 bytes against the machine's ~32). VNNI's vpdpwssd multiplies 32 pairs of
 * int16 and adds them into 16 int32 sums in one instruction: the weights need one widening
 * (int8 -> int16) per 32, and the activations become int16 once per product. AVX2 has no
 * VNNI, but vpmaddwd does the same for 16 pairs into 8 sums, and an add keeps them: on an
 * AVX2-only host (the Zen 3 ones) that is two instructions per 16 weights against the float
 * path's three per 8.
 *
 * Each activation row is scaled to int16 by its own largest magnitude (round to nearest): x_r
 * ~= xq_r * rscale_r. The scale leaves room for the int32 sums: |sum| <= k * 127 * limit must
 * stay below 2^31, so limit = min(32767, (2^31 - 1) / (127 k)): 15 bits at k = 576, 13.4 at
 * 1536, still ~100x finer than bf16's 8 (llama.cpp rounds activations to 8 bits for its
 * integer dot products). The result is exact integer arithmetic on the rounded rows, scaled
 * back: y[r, j] = rscale_r * scale_j * sum_i xq[r, i] * q[j, i], the same on both paths.
 */
#if defined(PLAIN_LOOPS)  /* layer.c's switch: no integer path either */
#elif defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define INT8_VNNI 1
#define INT16_ROWS 1
#elif defined(__AVX2__) && !defined(__AVX512F__)
#define INT8_MADD 1
#define INT16_ROWS 1
#endif

#ifdef INT16_ROWS
#include <stdlib.h>

/* The largest int16 an activation may round to for a k-long sum to fit int32. */
static inline float int16_limit(int64_t k)
{
    const double limit = 2147483647.0 / (127.0 * (double)k);
    return limit < 32767.0 ? (float)(int64_t)limit : 32767.f;
}
#endif

#ifdef INT8_VNNI
/* xq[r] (k_padded int16s, zero past k) and rscale[r] for each of m rows of x [m, k]. */
static void quantize_rows_i16(const float *x, int64_t m, int64_t k, int64_t k_padded, int16_t *xq, float *rscale)
{
    const float limit = int16_limit(k);
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        __m512 top = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i += 16) {
            const __mmask16 mask = i + 16 <= k ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
            top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, row + i)));
        }
        const float amax = _mm512_reduce_max_ps(top);
        const float inv = amax > 0.f ? limit / amax : 0.f;
        rscale[r] = amax > 0.f ? amax / limit : 0.f;
        const __m512 scale = _mm512_set1_ps(inv);
        for (int64_t i = 0; i < k_padded; i += 16) {
            const __mmask16 mask = i + 16 <= k ? (__mmask16)0xFFFF : i < k ? (__mmask16)((1u << (k - i)) - 1) : 0;
            const __m512i ints = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + i), scale));
            _mm256_storeu_si256((__m256i *)(xq + r * k_padded + i), _mm512_cvtsepi32_epi16(ints));
        }
    }
}

/* 32 int8 weights of a row from i on, widened to int16 (mask: those that exist). */
static inline __m512i weights32(const int8_t *row, int64_t i, int64_t k)
{
    if (i + 32 <= k) return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(row + i)));
    const __mmask32 mask = (__mmask32)((1ull << (k - i)) - 1);
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, row + i));
}

/* layer.c's dot_block for int8 weights and int16 rows: rw weight rows (`k` bytes apart)
 * times rx rows of xq (k_padded apart), int32 sums; writes the raw sums as floats. On the
 * first pass over a weight block (`first`) it prefetches the block two ahead: an int8 row of
 * 576 bytes is too short a stream for the hardware prefetcher to catch (1.4x at one row). */
static inline __attribute__((always_inline)) void dot_block_int16(const int16_t *xq, int64_t k_padded,
                                                                  const int8_t *w, int64_t k, float *y, int64_t ldy,
                                                                  const int rw, const int rx, int first)
{
    __m512i acc[WROWS][XROWS], wv[WROWS];
    #pragma GCC unroll 4
    for (int c = 0; c < rw; c++)
        #pragma GCC unroll 4
        for (int r = 0; r < rx; r++) acc[c][r] = _mm512_setzero_si512();
    for (int64_t i = 0; i < k; i += 32) {
        if (first && (i & 63) == 0)  /* the weights' first pass: the rows two blocks on, on their way */
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) _mm_prefetch((const char *)(w + (PREFETCH_BLOCKS * WROWS + c) * k + i), _MM_HINT_T0);
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) wv[c] = weights32(w + c * k, i, k);
        #pragma GCC unroll 4
        for (int r = 0; r < rx; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(xq + r * k_padded + i));
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) acc[c][r] = _mm512_dpwssd_epi32(acc[c][r], xv, wv[c]);
        }
    }
    if (rw == 4 && rx == 4) {  /* a whole block's 16 sums at once, as layer.c does */
        __m512 parts[16];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++) parts[4 * r + c] = _mm512_cvtepi32_ps(acc[c][r]);
        store_sums_4x4(parts, y, ldy);
        return;
    }
    #pragma GCC unroll 4
    for (int r = 0; r < rx; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) y[r * ldy + c] = (float)_mm512_reduce_add_epi32(acc[c][r]);
}

#endif

#ifdef INT8_MADD
/* xq[r] (k_padded int16s, zero past k) and rscale[r] for each of m rows of x [m, k], as the
 * VNNI path rounds them (to nearest, ties to even). */
static void quantize_rows_i16(const float *x, int64_t m, int64_t k, int64_t k_padded, int16_t *xq, float *rscale)
{
    const float limit = int16_limit(k);
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        float amax = 0.f;
        for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(row[i]));
        const float inv = amax > 0.f ? limit / amax : 0.f;
        rscale[r] = amax > 0.f ? amax / limit : 0.f;
        for (int64_t i = 0; i < k_padded; i++) xq[r * k_padded + i] = i < k ? (int16_t)lrintf(row[i] * inv) : 0;
    }
}

static inline int32_t sum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

/* The VNNI dot_block_int16's work for AVX2, on rw weight rows and at most two rows of xq: AVX2 has 16
 * vector registers, which hold a 4 x 2 block of sums, its 4 weight vectors and a row's; the
 * last k % 16 weights are summed one by one. */
static inline __attribute__((always_inline)) void dot_pair_madd(const int16_t *xq, int64_t k_padded, const int8_t *w,
                                                                int64_t k, float *y, int64_t ldy, const int rw,
                                                                const int rx, int first)
{
    __m256i acc[WROWS][2], wv[WROWS];
    #pragma GCC unroll 4
    for (int c = 0; c < rw; c++)
        #pragma GCC unroll 2
        for (int r = 0; r < rx; r++) acc[c][r] = _mm256_setzero_si256();
    const int64_t whole = k & ~(int64_t)15;
    for (int64_t i = 0; i < whole; i += 16) {
        if (first && (i & 63) == 0)  /* the weights' first pass: the rows two blocks on, on their way */
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) _mm_prefetch((const char *)(w + (PREFETCH_BLOCKS * WROWS + c) * k + i), _MM_HINT_T0);
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + c * k + i)));
        #pragma GCC unroll 2
        for (int r = 0; r < rx; r++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k_padded + i));
            #pragma GCC unroll 4
            for (int c = 0; c < rw; c++) acc[c][r] = _mm256_add_epi32(acc[c][r], _mm256_madd_epi16(xv, wv[c]));
        }
    }
    #pragma GCC unroll 2
    for (int r = 0; r < rx; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < rw; c++) {
            int32_t sum = sum_epi32(acc[c][r]);
            for (int64_t i = whole; i < k; i++) sum += (int32_t)xq[r * k_padded + i] * w[c * k + i];
            y[r * ldy + c] = (float)sum;
        }
}

static inline __attribute__((always_inline)) void dot_block_int16(const int16_t *xq, int64_t k_padded, const int8_t *w,
                                                                  int64_t k, float *y, int64_t ldy, const int rw,
                                                                  const int rx, int first)
{
    dot_pair_madd(xq, k_padded, w, k, y, ldy, rw, rx < 2 ? rx : 2, first);
    if (rx > 2) dot_pair_madd(xq + 2 * k_padded, k_padded, w, k, y + 2 * ldy, ldy, rw, rx - 2, 0);
}
#endif

#ifdef INT16_ROWS
/* dot_block_int16 with rw (WROWS, or 1 for the last n % WROWS weight rows) and rx (1..XROWS)
 * as compile-time constants: one copy of the loop per case. */
static void dot_block_int16_any(const int16_t *xq, int64_t k_padded, const int8_t *w, int64_t k, float *y,
                                int64_t ldy, int rw, int rx, int first)
{
#define INT16_CASE(RW, RX) case RX: dot_block_int16(xq, k_padded, w, k, y, ldy, RW, RX, first); return;
    if (rw == WROWS) {
        switch (rx) { INT16_CASE(WROWS, 1) INT16_CASE(WROWS, 2) INT16_CASE(WROWS, 3) INT16_CASE(WROWS, 4) }
    } else {
        switch (rx) { INT16_CASE(1, 1) INT16_CASE(1, 2) INT16_CASE(1, 3) INT16_CASE(1, 4) }
    }
#undef INT16_CASE
}

/* x's m rows rounded to int16 (above): *xq (*k_padded int16s a row, zero past k) and *rscale,
 * in a per-thread buffer kept between calls. Returns 0, or -1 if that buffer could not grow
 * (product() then widens the weights to float instead). */
static int int16_rows(const float *x, int64_t m, int64_t k, const int16_t **xq, const float **rscale,
                      int64_t *k_padded)
{
    static __thread int16_t *buffer = NULL;  /* the calling thread's; product()'s team reads it through xq */
    static __thread size_t capacity = 0;
    *k_padded = (k + 31) / 32 * 32;
    const size_t need = (size_t)(m * *k_padded) * sizeof(int16_t) + (size_t)m * sizeof(float);
    if (need > capacity) {
        free(buffer);
        buffer = (int16_t *)aligned_alloc(64, (need + 63) / 64 * 64);
        capacity = buffer ? need : 0;
        if (!buffer) return -1;
    }
    float *scales = (float *)(buffer + m * *k_padded);
    quantize_rows_i16(x, m, k, *k_padded, buffer, scales);
    *xq = buffer;
    *rscale = scales;
    return 0;
}
#endif
