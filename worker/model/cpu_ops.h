// The CPU side of the model library's operations: plain functions on host
// arrays, row-major, float32. Each has a CUDA twin in cuda_ops.cu doing the
// same math (cuda_ops.h); the backends (backend.h) call one or the other.
// Matrix products go through OpenBLAS; everything else is a simple loop in a
// fixed order, so results are deterministic for a fixed BLAS thread count.
// Stateless; thread-safe for disjoint outputs.
#ifndef PSTRAIN_WORKER_MODEL_CPU_OPS_H_
#define PSTRAIN_WORKER_MODEL_CPU_OPS_H_

#include <cstdint>
#include <string>

// DropoutKeep is compiled for the device too (cuda_ops.cu includes this
// header), so both backends draw the mask from the very same code.
#ifdef __CUDACC__
#define PSTRAIN_HOST_DEVICE __host__ __device__
#else
#define PSTRAIN_HOST_DEVICE
#endif

namespace pstrain {
namespace cpu {

// Sets OpenBLAS's thread count (process-wide).
void SetBlasThreads(int threads);

// OpenBLAS's name for the kernels it chose when it loaded ("Haswell", ...).
std::string BlasCoreName();

// OpenBLAS picks its kernels from the CPU's model name when the library
// loads. A VM that hides the model ("Intel(R) Xeon(R) Processor") gets the
// SSE3 "Prescott" kernels: on an AVX-512 host that made a 784-2048-2048-10
// step at batch 64 3x slower (77.8 against 25.6 ms on the H100 machine's
// Xeon). Where that happened in this process, returns the OPENBLAS_CORETYPE
// that fits the CPU's features ("SkylakeX" with AVX-512, "Haswell" with
// AVX2), to set before a process starts (the library reads it only then);
// "" where OpenBLAS chose a fitting core, the CPU has no AVX2, or
// OPENBLAS_CORETYPE is already set.
std::string BlasCoreTypeOverride();
// Called first in main (before any thread starts): where
// BlasCoreTypeOverride() names a core type, sets OPENBLAS_CORETYPE (and
// kBlasCoreReplacedEnv to the core OpenBLAS had chosen, which a worker's
// log names on its compute device line) and executes this binary again
// with the same arguments, so that OpenBLAS loads with kernels that fit.
// Nothing on stderr: a command's output is the same on any CPU. Returns only
// where nothing needed doing or the exec failed (then the slow kernels stay,
// and OpenDevice's warning says so).
inline constexpr char kBlasCoreReplacedEnv[] = "PSTRAIN_OPENBLAS_REPLACED_CORE";
void ReexecWithFittingBlasCore(const char* program, char** argv);
// The same decision from its inputs: OpenBLAS's core name, the CPU's
// features and OPENBLAS_CORETYPE's value (nullptr when unset).
std::string BlasCoreTypeFor(const std::string& core_name, bool avx512f, bool avx2,
                            const char* coretype_env);

// c[m, n] = alpha * op(a) * op(b) + beta * c, row-major; op(a) is [m, k]
// (a is [k, m] when trans_a), op(b) is [k, n] (b is [n, k] when trans_b).
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

// out[r, c] = row[c] for every r < rows.
void BroadcastRows(const float* row, int rows, int cols, float* out);

// out[c] = sum over r of x[r, c], accumulated in float in row order.
void SumRows(const float* x, int rows, int cols, float* out);

// Elementwise: y = a * b; y += a * b (the product rounded, then added: no
// fused multiply-add); y += a.
void Multiply(const float* a, const float* b, int64_t n, float* y);
void MultiplyAdd(const float* a, const float* b, int64_t n, float* y);
void Add(const float* a, int64_t n, float* y);

// y = max(x, 0); dx = y > 0 ? dy : 0.
void Relu(const float* x, int64_t n, float* y);
void ReluGrad(const float* y, const float* dy, int64_t n, float* dx);

// GELU, exact form: y = 0.5 x (1 + erf(x / sqrt 2));
// dx = dy * (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)).
void Gelu(const float* x, int64_t n, float* y);
void GeluGrad(const float* x, const float* dy, int64_t n, float* dx);

// Inverted dropout with a counter-based mask: element i is kept when
// DropoutKeep(seed, i, rate), and then scaled by 1 / (1 - rate). The mask is a
// pure function of (seed, i), so the backward pass recomputes it and the CUDA
// twin draws the very same mask.
void Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y);
void DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed, float* dx);

// splitmix64's finalizer: a well-mixed 64-bit hash of z. Seeds for dropout
// streams (per worker, step and layer) and the mask itself come from it.
PSTRAIN_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Mix64(seed + (i + 1) * 0x9E3779B97F4A7C15), top 24 bits as u in [0, 1):
// kept when u >= rate. The CUDA kernel calls this same function.
PSTRAIN_HOST_DEVICE inline bool DropoutKeep(uint64_t seed, uint64_t i, float rate) {
  const uint64_t z = Mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ULL);
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return u >= rate;
}

// Softmax cross-entropy over `rows` rows of `classes` logits, per row in
// double: m = max, s = sum exp(l - m), loss[r] = log s - (l[label] - m).
// dlogits[r, c] = float(exp(l[c] - m - log s)) / divisor, then
// dlogits[r, label] -= 1.0f / divisor (divisor is the batch size for a mean). `dlogits`,
// `row_loss` and `predicted` (argmax, first of equals) may each be null.
// Labels must be in [0, classes).
void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                         float divisor, float* dlogits, double* row_loss, int32_t* predicted);

// Sigmoid cross-entropy. With classes == 1 the target of row r is labels[r]
// (0 or 1); with classes > 1 the targets are one-hot(labels[r]). Per element
// in double: loss = max(l, 0) - l t + log(1 + exp(-|l|)); the row loss is the
// sum over its classes; dlogits = float(sigmoid(l) - t) / divisor. predicted is
// (l > 0) with one class, else the argmax. Any output may be null.
void SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                         float divisor, float* dlogits, double* row_loss, int32_t* predicted);

// DLRM's dot interaction: each example's `vectors` vectors of `dim` floats
// (t [batch, vectors, dim]), and their dot products for every pair i > j,
// in the order (1, 0), (2, 0), (2, 1), (3, 0), ...: pair p = i (i - 1) / 2 +
// j, written to out[b * out_ld + p]. Each dot sums its products in k's
// order, from zero.
void PairwiseDots(const float* t, int batch, int vectors, int dim, float* out, int out_ld);
// The gradient: dt[b, i, k] = the sum over j != i, in increasing j, of
// g(i, j) * t[b, j, k], g(i, j) = dout[b * dout_ld + pair(max, min)].
void PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch, int vectors,
                      int dim, float* dt);

// Embedding bags (the math of worker/model/embedding_bag.h), the model's
// input x [batch, width], width = dense_dim + fields * dim:
// x[b] = [dense[b] | bag(b, 0) | ... | bag(b, fields - 1)], bag (b, f) the
// sum of rows[row_of[k]] for k in [offsets[b * fields + f], offsets[... + 1])
// in k's order, times 1 / n (rounded to float) for the mean of n > 1 ids,
// zeros when empty.
void BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                 const float* dense, int batch, int fields, int dim, int dense_dim, bool mean,
                 float* x);
// row_grads[u] (unique rows, [unique, dim]) = the sum over u's occurrences
// t in [occ_start[u], occ_start[u + 1]) (occ_bag[t]: the occurrence's bag,
// b * fields + f, in increasing k) of scale(bag) * dx[b] at bag f's columns,
// scale 1 / n for the mean of n > 1 ids, else 1; accumulated from zero in
// that order, as EmbeddingBags::Backward does.
void BagsBackward(const float* dx, const int32_t* offsets, const int32_t* occ_start,
                  const int32_t* occ_bag, int unique, int fields, int dim, int dense_dim, bool mean,
                  float* row_grads);

}  // namespace cpu
}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_CPU_OPS_H_
