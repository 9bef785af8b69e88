/* Paged attention on the CPU, straight from the block pool: no gather, no padding.
 *
 * One work item per (query row, KV head): the row's G = heads / kv_heads query heads share
 * that KV head (grouped-query attention), so each key and value is read once for all G.
 * Keys are visited block by block through the row's block table with an online softmax (a
 * running max and sum per query head, the accumulator rescaled once per block), the same
 * algorithm as decode_attention.py's Triton kernel. A row attends to the first lens[i] tokens
 * of its sequence: a decode row to all of them, row j of a prefill chunk to those up to its
 * own position, which is the causal mask. A speculative tree's rows (tree_first, tree_bits: NULL
 * when the step has none) narrow that further: of the keys from position tree_first[i] on (the
 * tree's block: its root, the last emitted token, then its drafted nodes), row i sees only
 * those whose bit is set in tree_bits[i] (bit j: key tree_first[i] + j), its ancestors and
 * itself (bit 0, the root, is every row's); a row outside any tree has tree_first[i] = lens[i].
 * In a sliding layer (`window` > 0; 0: none) a row sees only the keys less than `window`
 * positions behind its own: a plain row, at position lens[i] - 1, the keys from lens[i] - window
 * on. A tree row sits at tree_first[i] + its depth; the caller has cleared its bits of ancestors
 * `window` or more levels up (backend.py's tree_bits), which leaves min(depth + 1, window) bits,
 * so its prefix keys begin at tree_first[i] + popcount(bits) - window (at tree_first[i] when the
 * window ends inside the tree). Blocks wholly before a row's first key are never read, so a
 * sliding layer costs its window, not the sequence's length.
 * Attention sinks (gpt-oss; `sinks`: one logit per query head, or NULL) join each head's softmax
 * denominator after its last block, as one more term with no value: the head may weigh nothing.
 *
 * With AVX-512 and a head size that is a multiple of 16, a block's scores and value sums use
 * vector code (block_scores, block_values: 1.2-1.4x the plain loops, bench_cpu_kernels.py);
 * the plain loops below are the rest, and what compilers without AVX-512 build.
 *
 * Compiled with -ffast-math, so the exponentials vectorize (glibc's libmvec): the kernel never
 * meets an infinity (the running max starts at -FLT_MAX, masked keys are never visited, and
 * attention.py clamps the sinks to finite floats).
 *
 * A pool may store bfloat16 values, or 8-bit codes with a one-byte scale per (token, KV head):
 * int8, or float8 e4m3 (quantized_kv.py), of rows rotated by a Walsh-Hadamard matrix H. Then each
 * block's rows of the head are read as codes and turned into floats on the stack
 * (dequantize_rows), where the float code above reads them for all G query heads: memory sees a
 * quarter of float32's bytes, and the block never leaves L1. The rotation costs two small
 * transforms per work item: the G query rows rotated going in (q . k = Hq . Hk), the G outputs
 * rotated back coming out (sum p Hv = H sum p v).
 *
 * Returns 0, or the number of rows whose table held a block id outside the pool where the row
 * reads, was too short for its length, or whose tree bits let it see no key (those rows are left
 * unwritten rather than read out of bounds).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_BLOCK 128

#if defined(__AVX512F__)
#include <immintrin.h>
#define VECTOR_ATTENTION 1

/* Lane t of the result = the sum of the 16 lanes of v[t]: sixteen dot products finished in
 * 45 shuffles and adds instead of 16 separate horizontal sums (~8 each). */
static inline __m512 sum_lanes16(const __m512 v[16])
{
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of v[2i], v[2i+1] */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)  /* per 128-bit lane: v[4i..4i+3]'s sums of that lane's 4 floats */
        quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* add the four 128-bit lanes: lanes 4i..4i+3 of the result come from quads[i] */
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* A 4x4 block of dot products still as 16-lane vectors (parts[4r + c]: activation row r,
 * weight row c), finished by sum_lanes16 and stored as y[r * ldy + c] (layer.c's and
 * int8.c's register blocks). */
static inline void store_sums_4x4(const __m512 parts[16], float *y, int64_t ldy)
{
    const __m512 sums = sum_lanes16(parts);  /* lanes 4r..4r+3: row r's four outputs */
    _mm_storeu_ps(y, _mm512_extractf32x4_ps(sums, 0));
    _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(y + 2 * ldy, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(y + 3 * ldy, _mm512_extractf32x4_ps(sums, 3));
}

/* scores[t] = scale * q . k_t for the `keys` keys from kb (token_stride floats apart), dim a
 * multiple of 16: each key's products stay a 16-lane vector until sum_lanes16 finishes 16 of
 * them at once. Inlined with a constant dim (below), q stays in registers. */
static inline __attribute__((always_inline)) void block_scores_dim(const float *qg, const float *kb,
                                                                   int64_t token_stride, int64_t keys,
                                                                   const int64_t dim, float scale, float *scores)
{
    __m512 q[MAX_DIM / 16];
    #pragma GCC unroll 16
    for (int64_t d = 0; d < dim; d += 16) q[d / 16] = _mm512_loadu_ps(qg + d);
    for (int64_t t0 = 0; t0 < keys; t0 += 16) {
        const int64_t n = keys - t0 < 16 ? keys - t0 : 16;
        __m512 part[16];
        for (int64_t j = 0; j < 16; j++) {
            part[j] = _mm512_setzero_ps();
            if (j < n) {
                const float *kt = kb + (t0 + j) * token_stride;
                #pragma GCC unroll 16
                for (int64_t d = 0; d < dim; d += 16)
                    part[j] = _mm512_fmadd_ps(q[d / 16], _mm512_loadu_ps(kt + d), part[j]);
            }
        }
        _mm512_mask_storeu_ps(scores + t0, (__mmask16)((1u << n) - 1), _mm512_mul_ps(sum_lanes16(part), _mm512_set1_ps(scale)));
    }
}

static void block_scores(const float *qg, const float *kb, int64_t token_stride, int64_t keys, int64_t dim,
                         float scale, float *scores)
{
    if (dim == 64) block_scores_dim(qg, kb, token_stride, keys, 64, scale, scores);  /* SmolLM2, Llama 1B/3B */
    else if (dim == 128) block_scores_dim(qg, kb, token_stride, keys, 128, scale, scores);
    else block_scores_dim(qg, kb, token_stride, keys, dim, scale, scores);
}

/* acc += sum_t p[t] * v_t over the `keys` values from vb, dim a multiple of 16 and at most
 * 128: the accumulator stays in registers across the block (a constant dim lets it). */
static inline __attribute__((always_inline)) void block_values_dim(const float *p, const float *vb,
                                                                   int64_t token_stride, int64_t keys,
                                                                   const int64_t dim, float *acc)
{
    __m512 a[8];
    #pragma GCC unroll 8
    for (int64_t c = 0; c < dim / 16; c++) a[c] = _mm512_loadu_ps(acc + 16 * c);
    for (int64_t t = 0; t < keys; t++) {
        const __m512 w = _mm512_set1_ps(p[t]);
        const float *vt = vb + t * token_stride;
        #pragma GCC unroll 8
        for (int64_t c = 0; c < dim / 16; c++) a[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + 16 * c), a[c]);
    }
    #pragma GCC unroll 8
    for (int64_t c = 0; c < dim / 16; c++) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

static void block_values(const float *p, const float *vb, int64_t token_stride, int64_t keys, int64_t dim, float *acc)
{
    if (dim == 64) block_values_dim(p, vb, token_stride, keys, 64, acc);
    else if (dim == 128) block_values_dim(p, vb, token_stride, keys, 128, acc);
    else block_values_dim(p, vb, token_stride, keys, dim, acc);
}
#endif

/* What a pool stores (quantized_kv.py's dtypes), and each one's bytes per value. */
enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2, KV_FP8 = 3 };
static const int64_t KV_BYTES[4] = {4, 2, 1, 1};

/* A scale byte (e << 4 | m) as its float, 2^(e - 12) * (1 + m / 16): e and m moved into a float's
 * exponent and mantissa fields (quantized_kv.scale_value). */
static inline float scale_value(uint8_t byte)
{
    const uint32_t bits = (uint32_t)((byte >> 4) + 127 - 12) << 23 | (uint32_t)(byte & 15) << 19;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The smallest scale byte whose value is >= ratio (quantized_kv.scale_byte): the mantissa rounded
 * up to 4 bits in the float's bits, a carry moving into the exponent; clamped to the range. */
static inline uint8_t scale_byte(float ratio)
{
    uint32_t bits;
    ratio = ratio > 0x1p-12f ? ratio : 0x1p-12f;
    memcpy(&bits, &ratio, 4);
    bits += (1u << 19) - 1;
    const int64_t exponent = (int64_t)(bits >> 23) - (127 - 12);
    return exponent > 15 ? 255 : (uint8_t)(exponent << 4 | ((bits >> 19) & 15));
}

#if defined(__AVX512F__)
/* One round of butterflies inside a vector: a lane outside `second` gets itself plus its partner
 * (a + b), a lane in it its partner minus itself (a - b): the same single add or subtract. */
static inline __m512 butterflies16(__m512 v, __m512 partner, __mmask16 second)
{
    return _mm512_mask_sub_ps(_mm512_add_ps(v, partner), second, partner, v);
}
#elif defined(__AVX2__)
#define BUTTERFLIES8(v, partner, second) \
    _mm256_blend_ps(_mm256_add_ps(v, partner), _mm256_sub_ps(partner, v), second)
#endif

/* x[0..dim) times the orthonormal Walsh-Hadamard matrix, block-diagonal in blocks of the largest
 * power of two dividing dim: butterflies (a + b, a - b) over pairs h apart, h = 1, 2, 4, ...,
 * then 1/sqrt(block): quantized_kv.rotate's operations in its order, so the same bits. The rounds
 * of pairs closer than a vector run inside each vector (lanes swapped, then one add or subtract a
 * lane): 8x fewer instructions than the plain loop, which does the rest. */
static void rotate_row(float *x, int64_t dim)
{
    const int64_t block = dim & -dim;
    int64_t h = 1;
#if defined(__AVX512F__)
    if (block >= 16) {  /* h = 1, 2, 4, 8 */
        for (int64_t d = 0; d < dim; d += 16) {
            __m512 v = _mm512_loadu_ps(x + d);
            v = butterflies16(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);        /* neighbours */
            v = butterflies16(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);        /* pairs of them */
            v = butterflies16(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);  /* 128-bit quarters */
            v = butterflies16(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);  /* 256-bit halves */
            _mm512_storeu_ps(x + d, v);
        }
        h = 16;
    }
#elif defined(__AVX2__)
    if (block >= 8) {  /* h = 1, 2, 4 */
        for (int64_t d = 0; d < dim; d += 8) {
            __m256 v = _mm256_loadu_ps(x + d);
            v = BUTTERFLIES8(v, _mm256_permute_ps(v, 0xB1), 0xAA);
            v = BUTTERFLIES8(v, _mm256_permute_ps(v, 0x4E), 0xCC);
            v = BUTTERFLIES8(v, _mm256_permute2f128_ps(v, v, 0x01), 0xF0);
            _mm256_storeu_ps(x + d, v);
        }
        h = 8;
    }
#endif
    for (; h < block; h *= 2)
        for (int64_t i = 0; i < dim; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float norm = (float)(1.0 / sqrt((double)block));
    for (int64_t d = 0; d < dim; d++) x[d] *= norm;
}

/* n rows of dim floats rotated in place: rotate_row exported, for the tests to hold it to torch's bits. */
void rotate_rows_f32(float *x, int64_t n, int64_t dim)
{
    for (int64_t i = 0; i < n; i++) rotate_row(x + i * dim, dim);
}

/* An e4m3 code's value / 256: its sign, exponent and mantissa moved into float16's fields (whose
 * exponent bias, 15, is 8 above e4m3's 7): exact for every code, subnormals included. */
static inline float fp8_value_over_256(uint8_t code)
{
    const uint16_t bits = (uint16_t)(((code & 0x80) << 8) | ((code & 0x7F) << 7));
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}

/* `keys` rows of one KV head of a bfloat16, int8 or fp8 pool as floats: row t's dim values from
 * element first + t * token_stride (its scale: element / dim of the scales) to dst[t * dim].
 * Written out for AVX-512 (16 values a step) and AVX2 + F16C (8), the two vector widths our
 * hosts have (the compiler does not vectorize the fp8 conversion of the plain loops below). */
static void dequantize_rows(const void *pool, const uint8_t *scales, int kind, int64_t first, int64_t token_stride,
                            int64_t keys, int64_t dim, float *dst)
{
#ifdef VECTOR_ATTENTION
    if (dim % 16 == 0) {  /* 16 values a step: widen, convert, scale */
        for (int64_t t = 0; t < keys; t++) {
            const int64_t at = first + t * token_stride;
            float *row = dst + t * dim;
            if (kind == KV_BF16) {
                const uint16_t *src = (const uint16_t *)pool + at;
                for (int64_t d = 0; d < dim; d += 16)
                    _mm512_storeu_ps(row + d, _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + d))), 16)));
            } else if (kind == KV_INT8) {
                const int8_t *src = (const int8_t *)pool + at;
                const __m512 scale = _mm512_set1_ps(scale_value(scales[at / dim]));
                for (int64_t d = 0; d < dim; d += 16)
                    _mm512_storeu_ps(row + d, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + d))))));
            } else {  /* fp8_value_over_256, 16 codes at once: their bits moved into float16's fields */
                const uint8_t *src = (const uint8_t *)pool + at;
                const __m512 scale = _mm512_set1_ps(256.f * scale_value(scales[at / dim]));
                for (int64_t d = 0; d < dim; d += 16) {
                    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(src + d)));
                    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                                      _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7));
                    _mm512_storeu_ps(row + d, _mm512_mul_ps(scale, _mm512_cvtph_ps(h)));
                }
            }
        }
        return;
    }
#elif defined(__AVX2__) && defined(__F16C__)
    if (dim % 8 == 0) {  /* the same, 8 values a step: AVX2 hosts */
        for (int64_t t = 0; t < keys; t++) {
            const int64_t at = first + t * token_stride;
            float *row = dst + t * dim;
            if (kind == KV_BF16) {
                const uint16_t *src = (const uint16_t *)pool + at;
                for (int64_t d = 0; d < dim; d += 8)
                    _mm256_storeu_ps(row + d, _mm256_castsi256_ps(_mm256_slli_epi32(
                        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + d))), 16)));
            } else if (kind == KV_INT8) {
                const int8_t *src = (const int8_t *)pool + at;
                const __m256 scale = _mm256_set1_ps(scale_value(scales[at / dim]));
                for (int64_t d = 0; d < dim; d += 8)
                    _mm256_storeu_ps(row + d, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + d))))));
            } else {
                const uint8_t *src = (const uint8_t *)pool + at;
                const __m256 scale = _mm256_set1_ps(256.f * scale_value(scales[at / dim]));
                for (int64_t d = 0; d < dim; d += 8) {
                    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(src + d)));
                    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
                    _mm256_storeu_ps(row + d, _mm256_mul_ps(scale, _mm256_cvtph_ps(h)));
                }
            }
        }
        return;
    }
#endif
    for (int64_t t = 0; t < keys; t++) {
        const int64_t at = first + t * token_stride;
        float *row = dst + t * dim;
        if (kind == KV_BF16) {
            const uint16_t *src = (const uint16_t *)pool + at;
            #pragma omp simd
            for (int64_t d = 0; d < dim; d++) {
                const uint32_t bits = (uint32_t)src[d] << 16;
                memcpy(row + d, &bits, 4);
            }
        } else if (kind == KV_INT8) {
            const int8_t *src = (const int8_t *)pool + at;
            const float scale = scale_value(scales[at / dim]);
            #pragma omp simd
            for (int64_t d = 0; d < dim; d++) row[d] = scale * (float)src[d];
        } else {
            const uint8_t *src = (const uint8_t *)pool + at;
            const float scale = 256.f * scale_value(scales[at / dim]);
            #pragma omp simd
            for (int64_t d = 0; d < dim; d++) row[d] = scale * fp8_value_over_256(src[d]);
        }
    }
}

/* A float e4m3 code for |x| <= 448, rounded to nearest even (as torch's conversion rounds). */
static inline uint8_t fp8_code(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    const float a = fabsf(x);
    if (a < 0.015625f)  /* below e4m3's smallest normal, 2^-6: subnormal steps of 2^-9 */
        return sign | (uint8_t)nearbyintf(a * 512.f);  /* 8 steps = 0x08, the smallest normal's code */
    uint32_t m = bits & 0x7FFFFFFF;
    m += 0x7FFFF + ((m >> 20) & 1);  /* round the mantissa to 3 bits, ties to even */
    int64_t e = (int64_t)(m >> 23) - 127 + 7, mant = (m >> 20) & 7;
    if (e > 15 || (e == 15 && mant == 7)) { e = 15; mant = 6; }  /* 448, the largest finite code */
    return sign | (uint8_t)(e << 3) | (uint8_t)mant;
}

/* Row x's kv_heads heads (dim floats each) into slot `slot` of a pool of `kind`: copied, rounded to
 * bfloat16, or rotated and quantized with a scale byte per head (quantized_kv.store_rows' math). */
static void store_kv_row(void *pool, uint8_t *scales, int kind, int64_t slot, const float *x, int64_t kv_heads,
                         int64_t dim)
{
    const int64_t width = kv_heads * dim, at = slot * width;
    if (kind == KV_F32) { memcpy((float *)pool + at, x, (size_t)width * sizeof(float)); return; }
    if (kind == KV_BF16) {
        uint16_t *dst = (uint16_t *)pool + at;
        for (int64_t i = 0; i < width; i++) {
            uint32_t bits;
            memcpy(&bits, x + i, 4);
            dst[i] = (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);  /* ties to even */
        }
        return;
    }
    const float qmax = kind == KV_INT8 ? 127.f : 448.f;
    float xh[MAX_DIM];
    for (int64_t h = 0; h < kv_heads; h++) {
        memcpy(xh, x + h * dim, (size_t)dim * sizeof(float));
        rotate_row(xh, dim);
        float amax = 0.f;
        for (int64_t d = 0; d < dim; d++) amax = fmaxf(amax, fabsf(xh[d]));
        const uint8_t byte = scale_byte(amax / qmax);
        scales[slot * kv_heads + h] = byte;
        const float scale = scale_value(byte);  /* divide by the scale as stored */
        for (int64_t d = 0; d < dim; d++) {
            const float c = fminf(fmaxf(xh[d] / scale, -qmax), qmax);
            if (kind == KV_INT8) ((int8_t *)pool)[at + h * dim + d] = (int8_t)nearbyintf(c);
            else ((uint8_t *)pool)[at + h * dim + d] = fp8_code(c);
        }
    }
}

int64_t paged_attention_rows_f32(
    const float *q, int64_t q_row_stride,       /* [T, heads, dim]; heads x dim contiguous */
    float *out,                                  /* [T, heads, dim], contiguous */
    const void *k_pool, const void *v_pool,      /* [num_blocks, block_size, kv_heads, dim] of `kind` */
    int kind, const uint8_t *k_scale, const uint8_t *v_scale,  /* [num_blocks, block_size, kv_heads]: int8, fp8 */
    int64_t num_blocks,
    const int64_t *rows, const int64_t *seqs, const int64_t *lens, int64_t n,  /* per work row */
    const int64_t *tree_first, const uint64_t *tree_bits,                     /* per work row, or NULL */
    int64_t window,                                                            /* the layer's; 0: none */
    const float *sinks,                                                        /* [heads], or NULL: none */
    const int64_t *block_tables, int64_t table_width,                          /* [num_seqs, width] */
    int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float scale, int num_threads)
{
    const int64_t group = heads / kv_heads, token_stride = kv_heads * dim;
    const int rotated = kind == KV_INT8 || kind == KV_FP8;  /* codes of rotated rows (quantized_kv.py) */
    int64_t bad_rows = 0;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads) reduction(+:bad_rows)
    for (int64_t i = 0; i < n; i++) {
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            const int64_t len = lens[i];
            const int64_t first = tree_first ? tree_first[i] : len;  /* keys from here on: by tree_bits */
            const uint64_t bits = tree_bits ? tree_bits[i] : 0;
            const int in_tree = first < len;
            /* the row's bits of keys before len; in a sliding layer the root's may be cleared */
            const uint64_t seen = !in_tree ? 0 : len - first >= 64 ? bits : bits & ((1ull << (len - first)) - 1);
            if (first < 0 || (in_tree && (len - first > 64 || !(window > 0 ? seen : bits & 1)))) {
                bad_rows += kv == 0;
                continue;
            }
            /* the first key the row sees: 0, or its window's first (see the top of the file) */
            int64_t from = 0;
            if (window > 0) {
                from = in_tree ? first + __builtin_popcountll(seen) - window : len - window;
                from = from < 0 ? 0 : in_tree && from > first ? first : from;  /* tree keys: by bits alone */
            }
            const int64_t *table = block_tables + seqs[i] * table_width;
            if (len < 1 || len > table_width * block_size) { bad_rows += kv == 0; continue; }
            int ok = 1;
            for (int64_t b = from / block_size; b * block_size < len; b++) ok &= table[b] >= 0 && table[b] < num_blocks;
            if (!ok) { bad_rows += kv == 0; continue; }

            const float *qh = q + rows[i] * q_row_stride + kv * group * dim;
            float maxs[MAX_GROUP], sums[MAX_GROUP], acc[MAX_GROUP * MAX_DIM], p[MAX_GROUP * MAX_BLOCK];
            float q_rotated[rotated ? MAX_GROUP * MAX_DIM : 1];
            if (rotated) {  /* so is the query */
                memcpy(q_rotated, qh, (size_t)(group * dim) * sizeof(float));
                for (int64_t g = 0; g < group; g++) rotate_row(q_rotated + g * dim, dim);
                qh = q_rotated;
            }
            float kbuf[kind == KV_F32 ? 1 : block_size * dim], vbuf[kind == KV_F32 ? 1 : block_size * dim];
            const int64_t bytes = KV_BYTES[kind], stride = kind == KV_F32 ? token_stride : dim;
            for (int64_t g = 0; g < group; g++) { maxs[g] = -FLT_MAX; sums[g] = 0.f; }
            for (int64_t x = 0; x < group * dim; x++) acc[x] = 0.f;

            for (int64_t start = from - from % block_size; start < len; start += block_size) {  /* from `from`'s block */
                const int64_t keys = len - start < block_size ? len - start : block_size;
                const int64_t offset = table[start / block_size] * block_size * token_stride + kv * dim;
                const float *kb = (const float *)k_pool + offset, *vb = (const float *)v_pool + offset;
                if (kind != KV_F32) {  /* the block's codes of this head, as floats */
                    dequantize_rows(k_pool, k_scale, kind, offset, token_stride, keys, dim, kbuf);
                    dequantize_rows(v_pool, v_scale, kind, offset, token_stride, keys, dim, vbuf);
                    kb = kbuf;
                    vb = vbuf;
                }
                if (start + block_size < len) {  /* the next block's rows of this head, on their way */
                    const int64_t next = table[start / block_size + 1] * block_size * token_stride + kv * dim;
                    for (int64_t t = 0; t < block_size; t++)
                        for (int64_t d = 0; d < dim * bytes; d += 64) {
                            __builtin_prefetch((const char *)k_pool + (next + t * token_stride) * bytes + d);
                            __builtin_prefetch((const char *)v_pool + (next + t * token_stride) * bytes + d);
                        }
                }
                for (int64_t g = 0; g < group; g++) {       /* scores, then the online softmax */
                    const float *qg = qh + g * dim;
                    float *pg = p + g * MAX_BLOCK, block_max = -FLT_MAX;
#ifdef VECTOR_ATTENTION
                    if (dim % 16 == 0) block_scores(qg, kb, stride, keys, dim, scale, pg);
                    else
#endif
                    for (int64_t t = 0; t < keys; t++) {
                        const float *kt = kb + t * stride;
                        float s = 0.f;
                        #pragma omp simd reduction(+:s)
                        for (int64_t d = 0; d < dim; d++) s += qg[d] * kt[d];
                        pg[t] = s * scale;
                    }
                    const int64_t hidden_from = first > start ? first - start : 0;  /* tree keys of the block */
                    for (int64_t t = hidden_from; t < keys; t++)  /* a key off the row's path never counts */
                        if (!((bits >> (start + t - first)) & 1)) pg[t] = -FLT_MAX;
                    for (int64_t t = 0; t < from - start; t++) pg[t] = -FLT_MAX;  /* before the window (first block) */
                    for (int64_t t = 0; t < keys; t++) block_max = pg[t] > block_max ? pg[t] : block_max;
                    const float new_max = block_max > maxs[g] ? block_max : maxs[g];
                    const float rescale = expf(maxs[g] - new_max);  /* 0 on the first block: exp(-FLT_MAX - m) */
                    sums[g] *= rescale;
                    for (int64_t d = 0; d < dim; d++) acc[g * dim + d] *= rescale;
                    for (int64_t t = 0; t < keys; t++) {
                        pg[t] = pg[t] == -FLT_MAX ? 0.f : expf(pg[t] - new_max);
                        sums[g] += pg[t];
                    }
                    maxs[g] = new_max;
                }
#ifdef VECTOR_ATTENTION
                if (dim % 16 == 0 && dim <= 128) {  /* per head, its accumulator in registers over the block */
                    for (int64_t g = 0; g < group; g++)
                        block_values(p + g * MAX_BLOCK, vb, stride, keys, dim, acc + g * dim);
                } else
#endif
                for (int64_t t = 0; t < keys; t++) {         /* each value read once for the G heads */
                    const float *vt = vb + t * stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float w = p[g * MAX_BLOCK + t];
                        float *a = acc + g * dim;
                        #pragma omp simd
                        for (int64_t d = 0; d < dim; d++) a[d] += w * vt[d];
                    }
                }
            }
            if (sinks) {  /* each head's sink s: one more term of its denominator, exp(s), with no value */
                for (int64_t g = 0; g < group; g++) {
                    const float s = sinks[kv * group + g];
                    const float new_max = s > maxs[g] ? s : maxs[g];
                    /* as for a block: the sum and accumulator rescaled to the new max (0 if the row
                     * saw no key: maxs[g] is still -FLT_MAX; then the output is 0, not 0 / 0) */
                    const float rescale = expf(maxs[g] - new_max);
                    sums[g] = sums[g] * rescale + expf(s - new_max);
                    for (int64_t d = 0; d < dim; d++) acc[g * dim + d] *= rescale;
                }
            }
            float *o = out + (rows[i] * heads + kv * group) * dim;
            for (int64_t g = 0; g < group; g++) {
                for (int64_t d = 0; d < dim; d++) o[g * dim + d] = acc[g * dim + d] / sums[g];
                if (rotated) rotate_row(o + g * dim, dim);  /* back from the values' basis */
            }
        }
    }
    return bad_rows;
}
