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
 *
 * With AVX-512 and a head size that is a multiple of 16, a block's scores and value sums use
 * vector code (block_scores, block_values: 1.2-1.4x the plain loops, bench_cpu_kernels.py);
 * the plain loops below are the rest, and what compilers without AVX-512 build.
 *
 * Compiled with -ffast-math, so the exponentials vectorize (glibc's libmvec): the kernel never
 * meets an infinity (the running max starts at -FLT_MAX, masked keys are never visited).
 *
 * Returns 0, or the number of rows whose table held a block id outside the pool or was too
 * short for its length (those rows are left unwritten rather than read out of bounds).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

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

int64_t paged_attention_rows_f32(
    const float *q, int64_t q_row_stride,       /* [T, heads, dim]; heads x dim contiguous */
    float *out,                                  /* [T, heads, dim], contiguous */
    const float *k_pool, const float *v_pool,    /* [num_blocks, block_size, kv_heads, dim] */
    int64_t num_blocks,
    const int64_t *rows, const int64_t *seqs, const int64_t *lens, int64_t n,  /* per work row */
    const int64_t *tree_first, const uint64_t *tree_bits,                     /* per work row, or NULL */
    const int64_t *block_tables, int64_t table_width,                          /* [num_seqs, width] */
    int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float scale, int num_threads)
{
    const int64_t group = heads / kv_heads, token_stride = kv_heads * dim;
    int64_t bad_rows = 0;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads) reduction(+:bad_rows)
    for (int64_t i = 0; i < n; i++) {
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            const int64_t len = lens[i];
            const int64_t first = tree_first ? tree_first[i] : len;  /* keys from here on: by tree_bits */
            const uint64_t bits = tree_bits ? tree_bits[i] : 0;
            if (first < 0 || (first < len && (len - first > 64 || !(bits & 1)))) { bad_rows += kv == 0; continue; }
            const int64_t *table = block_tables + seqs[i] * table_width;
            if (len < 1 || len > table_width * block_size) { bad_rows += kv == 0; continue; }
            int ok = 1;
            for (int64_t b = 0; b * block_size < len; b++) ok &= table[b] >= 0 && table[b] < num_blocks;
            if (!ok) { bad_rows += kv == 0; continue; }

            const float *qh = q + rows[i] * q_row_stride + kv * group * dim;
            float maxs[MAX_GROUP], sums[MAX_GROUP], acc[MAX_GROUP * MAX_DIM], p[MAX_GROUP * MAX_BLOCK];
            for (int64_t g = 0; g < group; g++) { maxs[g] = -FLT_MAX; sums[g] = 0.f; }
            for (int64_t x = 0; x < group * dim; x++) acc[x] = 0.f;

            for (int64_t start = 0; start < len; start += block_size) {
                const int64_t keys = len - start < block_size ? len - start : block_size;
                const int64_t offset = table[start / block_size] * block_size * token_stride + kv * dim;
                const float *kb = k_pool + offset, *vb = v_pool + offset;
                if (start + block_size < len) {  /* the next block's rows of this head, on their way */
                    const int64_t next = table[start / block_size + 1] * block_size * token_stride + kv * dim;
                    for (int64_t t = 0; t < block_size; t++)
                        for (int64_t d = 0; d < dim; d += 16) {
                            __builtin_prefetch(k_pool + next + t * token_stride + d);
                            __builtin_prefetch(v_pool + next + t * token_stride + d);
                        }
                }
                for (int64_t g = 0; g < group; g++) {       /* scores, then the online softmax */
                    const float *qg = qh + g * dim;
                    float *pg = p + g * MAX_BLOCK, block_max = -FLT_MAX;
#ifdef VECTOR_ATTENTION
                    if (dim % 16 == 0) block_scores(qg, kb, token_stride, keys, dim, scale, pg);
                    else
#endif
                    for (int64_t t = 0; t < keys; t++) {
                        const float *kt = kb + t * token_stride;
                        float s = 0.f;
                        #pragma omp simd reduction(+:s)
                        for (int64_t d = 0; d < dim; d++) s += qg[d] * kt[d];
                        pg[t] = s * scale;
                    }
                    const int64_t hidden_from = first > start ? first - start : 0;  /* tree keys of the block */
                    for (int64_t t = hidden_from; t < keys; t++)  /* a key off the row's path never counts */
                        if (!((bits >> (start + t - first)) & 1)) pg[t] = -FLT_MAX;
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
                        block_values(p + g * MAX_BLOCK, vb, token_stride, keys, dim, acc + g * dim);
                } else
#endif
                for (int64_t t = 0; t < keys; t++) {         /* each value read once for the G heads */
                    const float *vt = vb + t * token_stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float w = p[g * MAX_BLOCK + t];
                        float *a = acc + g * dim;
                        #pragma omp simd
                        for (int64_t d = 0; d < dim; d++) a[d] += w * vt[d];
                    }
                }
            }
            float *o = out + (rows[i] * heads + kv * group) * dim;
            for (int64_t g = 0; g < group; g++)
                for (int64_t d = 0; d < dim; d++) o[g * dim + d] = acc[g * dim + d] / sums[g];
        }
    }
    return bad_rows;
}
