/* Paged attention on the CPU, straight from the block pool: no gather, no padding.
 *
 * One work item per (query row, KV head): the row's G = heads / kv_heads query heads share
 * that KV head (grouped-query attention), so each key and value is read once for all G.
 * Keys are visited block by block through the row's block table with an online softmax (a
 * running max and sum per query head, the accumulator rescaled once per block), the same
 * algorithm as decode_attention.py's Triton kernel. A row attends to the first lens[i] tokens
 * of its sequence: a decode row to all of them, row j of a prefill chunk to those up to its
 * own position, which is the causal mask.
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

int64_t paged_attention_rows_f32(
    const float *q, int64_t q_row_stride,       /* [T, heads, dim]; heads x dim contiguous */
    float *out,                                  /* [T, heads, dim], contiguous */
    const float *k_pool, const float *v_pool,    /* [num_blocks, block_size, kv_heads, dim] */
    int64_t num_blocks,
    const int64_t *rows, const int64_t *seqs, const int64_t *lens, int64_t n,  /* per work row */
    const int64_t *block_tables, int64_t table_width,                          /* [num_seqs, width] */
    int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float scale, int num_threads)
{
    const int64_t group = heads / kv_heads, token_stride = kv_heads * dim;
    int64_t bad_rows = 0;
    #pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads) reduction(+:bad_rows)
    for (int64_t i = 0; i < n; i++) {
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            const int64_t len = lens[i];
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
                    for (int64_t t = 0; t < keys; t++) {
                        const float *kt = kb + t * token_stride;
                        float s = 0.f;
                        #pragma omp simd reduction(+:s)
                        for (int64_t d = 0; d < dim; d++) s += qg[d] * kt[d];
                        pg[t] = s * scale;
                        block_max = pg[t] > block_max ? pg[t] : block_max;
                    }
                    const float new_max = block_max > maxs[g] ? block_max : maxs[g];
                    const float rescale = expf(maxs[g] - new_max);  /* 0 on the first block: exp(-FLT_MAX - m) */
                    sums[g] *= rescale;
                    for (int64_t d = 0; d < dim; d++) acc[g * dim + d] *= rescale;
                    for (int64_t t = 0; t < keys; t++) { pg[t] = expf(pg[t] - new_max); sums[g] += pg[t]; }
                    maxs[g] = new_max;
                }
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
