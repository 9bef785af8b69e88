/* The fused model's small ops on the CPU, each one pass over its rows (fused_norm.py and
 * rotary.py do the same work as Triton kernels). Float32, rows contiguous in their last dim;
 * a row stride is given where the caller passes a view. Rows are split over the threads only
 * when there are enough of them: forking a team costs more than normalizing one row.
 *
 * Compiled without -ffast-math and with -ffp-contract=off: the same roundings as torch's
 * elementwise ops; only the order of the sum of squares (and silu's exp) can differ.
 */
#include <math.h>
#include <stdint.h>

#define PARALLEL_ROWS 16

/* out = weight * x / sqrt(mean(x^2) + eps) per row; with a residual, x + residual is written to
 * sum_out and normalized instead. */
void add_rms_norm_f32(const float *x, const float *residual, float *sum_out, float *out, const float *weight,
                      int64_t rows, int64_t dim, float eps, int num_threads)
{
    #pragma omp parallel for num_threads(num_threads) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + r * dim;
        float *o = out + r * dim, squares = 0.f;
        if (residual) {
            const float *res = residual + r * dim;
            float *sum = sum_out + r * dim;
            #pragma omp simd reduction(+:squares)
            for (int64_t d = 0; d < dim; d++) { sum[d] = src[d] + res[d]; squares += sum[d] * sum[d]; }
            src = sum;
        } else {
            #pragma omp simd reduction(+:squares)
            for (int64_t d = 0; d < dim; d++) squares += src[d] * src[d];
        }
        const float inv = 1.f / sqrtf(squares / dim + eps);
        for (int64_t d = 0; d < dim; d++) o[d] = weight[d] * (src[d] * inv);
    }
}

/* Qwen3's q/k norm, in place: add_rms_norm_f32's math over each head's dim channels of
 * x [tokens, heads, dim], tokens token_stride apart (q or k, a view into the QKV output). */
void head_rms_norm_f32(float *x, int64_t token_stride, int64_t heads, const float *weight, int64_t tokens,
                       int64_t dim, float eps, int num_threads)
{
    #pragma omp parallel for num_threads(num_threads) if (tokens >= PARALLEL_ROWS)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *row = x + t * token_stride + h * dim, squares = 0.f;
            #pragma omp simd reduction(+:squares)
            for (int64_t d = 0; d < dim; d++) squares += row[d] * row[d];
            const float inv = 1.f / sqrtf(squares / dim + eps);
            for (int64_t d = 0; d < dim; d++) row[d] = weight[d] * (row[d] * inv);
        }
}

/* RoPE in place ("rotate half"): channel i pairs with i + half. x: [tokens, heads, 2 * half]
 * with a token stride (q and k are views into the QKV output); cos/sin: [tokens, half]. */
static void rotate(float *x, int64_t token_stride, int64_t heads, const float *cos, const float *sin,
                   int64_t t, int64_t half)
{
    const float *c = cos + t * half, *s = sin + t * half;
    for (int64_t h = 0; h < heads; h++) {
        float *first = x + t * token_stride + h * 2 * half, *second = first + half;
        for (int64_t i = 0; i < half; i++) {
            const float x1 = first[i], x2 = second[i];
            first[i] = x1 * c[i] - x2 * s[i];
            second[i] = x2 * c[i] + x1 * s[i];
        }
    }
}

void rotary_f32(float *q, int64_t q_stride, int64_t q_heads, float *k, int64_t k_stride, int64_t k_heads,
                const float *cos, const float *sin, int64_t tokens, int64_t half, int num_threads)
{
    #pragma omp parallel for num_threads(num_threads) if (tokens >= PARALLEL_ROWS)
    for (int64_t t = 0; t < tokens; t++) {
        rotate(q, q_stride, q_heads, cos, sin, t, half);
        rotate(k, k_stride, k_heads, cos, sin, t, half);
    }
}

/* SwiGLU's middle: out[r] = silu(gate) * up, where gate_up[r] = [gate | up], each `dim` wide. */
void silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim, int num_threads)
{
    #pragma omp parallel for num_threads(num_threads) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * dim, *up = gate + dim;
        float *o = out + r * dim;
        for (int64_t d = 0; d < dim; d++) o[d] = gate[d] / (1.f + expf(-gate[d])) * up[d];
    }
}
