#include "worker/model/cpu_ops.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace pstrain {
namespace cpu {

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

std::string BlasCoreTypeFor(const std::string& core_name, bool avx512f, bool avx2,
                            const char* coretype_env) {
  if (coretype_env != nullptr && coretype_env[0] != '\0') return "";
  const char* fits = avx512f ? "SkylakeX" : avx2 ? "Haswell" : nullptr;
  if (fits == nullptr) return "";
  // OpenBLAS's x86 cores older than AVX2 (and its "unknown").
  static const char* const kOld[] = {"prescott",  "core2",   "penryn",     "dunnington",
                                     "nehalem",   "atom",    "katmai",     "coppermine",
                                     "northwood", "banias",  "opteron",    "opteron_sse3",
                                     "barcelona", "bobcat",  "athlon",     "sandybridge",
                                     "unknown"};
  const std::string chosen = absl::AsciiStrToLower(core_name);
  for (const char* old : kOld) {
    if (chosen == old) return fits;
  }
  return "";
}

std::string BlasCoreTypeOverride() {
  __builtin_cpu_init();
  return BlasCoreTypeFor(BlasCoreName(), __builtin_cpu_supports("avx512f"),
                         __builtin_cpu_supports("avx2"), std::getenv("OPENBLAS_CORETYPE"));
}

void ReexecWithFittingBlasCore(const char* program, char** argv) {
  const std::string fits = BlasCoreTypeOverride();
  if (fits.empty()) return;
  // Said in the worker's log (its compute device line), not on stderr: a
  // command's own output (an error, a table) stays what it is on any CPU.
  if (::setenv(kBlasCoreReplacedEnv, BlasCoreName().c_str(), 1) != 0) return;
  if (::setenv("OPENBLAS_CORETYPE", fits.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr, "%s: exec /proc/self/exe failed (%s); going on with %s's kernels\n",
               program, std::strerror(errno), BlasCoreName().c_str());
}

void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void BroadcastRows(const float* row, int rows, int cols, float* out) {
  for (int r = 0; r < rows; ++r) std::copy(row, row + cols, out + static_cast<int64_t>(r) * cols);
}

void SumRows(const float* x, int rows, int cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<int64_t>(r) * cols;
    for (int c = 0; c < cols; ++c) out[c] += row[c];
  }
}

void Multiply(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void MultiplyAdd(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] * b[i];
}

void Add(const float* a, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i];
}

void Relu(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ReluGrad(const float* y, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
}  // namespace

void Gelu(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void GeluGrad(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

void Dropout(const float* x, int64_t n, float rate, uint64_t seed, float* y) {
  const float scale = 1.0f / (1.0f - rate);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = DropoutKeep(seed, static_cast<uint64_t>(i), rate) ? x[i] * scale : 0.0f;
  }
}

void DropoutGrad(const float* dy, int64_t n, float rate, uint64_t seed, float* dx) {
  Dropout(dy, n, rate, seed, dx);
}

void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                         float divisor, float* dlogits, double* row_loss, int32_t* predicted) {
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<int64_t>(r) * classes;
    const float* max_it = std::max_element(l, l + classes);
    const float max = *max_it;
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(l[c] - max));
    const double log_sum = std::log(sum);
    const int label = labels[r];
    if (row_loss != nullptr) row_loss[r] = log_sum - static_cast<double>(l[label] - max);
    if (predicted != nullptr) predicted[r] = static_cast<int32_t>(max_it - l);
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<int64_t>(r) * classes;
      for (int c = 0; c < classes; ++c) {
        d[c] = static_cast<float>(std::exp(static_cast<double>(l[c] - max) - log_sum)) / divisor;
      }
      d[label] -= 1.0f / divisor;
    }
  }
}

void SigmoidCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                         float divisor, float* dlogits, double* row_loss, int32_t* predicted) {
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<int64_t>(r) * classes;
    double loss = 0;
    for (int c = 0; c < classes; ++c) {
      const double t =
          classes == 1 ? static_cast<double>(labels[r] != 0) : static_cast<double>(labels[r] == c);
      const double v = l[c];
      loss += std::max(v, 0.0) - v * t + std::log1p(std::exp(-std::fabs(v)));
      if (dlogits != nullptr) {
        const double p = 1.0 / (1.0 + std::exp(-v));
        dlogits[static_cast<int64_t>(r) * classes + c] = static_cast<float>(p - t) / divisor;
      }
    }
    if (row_loss != nullptr) row_loss[r] = loss;
    if (predicted != nullptr) {
      predicted[r] = classes == 1 ? (l[0] > 0.0f ? 1 : 0)
                                  : static_cast<int32_t>(std::max_element(l, l + classes) - l);
    }
  }
}

void PairwiseDots(const float* t, int batch, int vectors, int dim, float* out, int out_ld) {
  for (int b = 0; b < batch; ++b) {
    const float* v = t + static_cast<size_t>(b) * vectors * dim;
    float* o = out + static_cast<size_t>(b) * out_ld;
    for (int i = 1; i < vectors; ++i) {
      for (int j = 0; j < i; ++j) {
        float acc = 0.0f;
        for (int k = 0; k < dim; ++k) acc += v[i * dim + k] * v[j * dim + k];
        o[i * (i - 1) / 2 + j] = acc;
      }
    }
  }
}

void PairwiseDotsGrad(const float* t, const float* dout, int dout_ld, int batch, int vectors,
                      int dim, float* dt) {
  for (int b = 0; b < batch; ++b) {
    const float* v = t + static_cast<size_t>(b) * vectors * dim;
    const float* g = dout + static_cast<size_t>(b) * dout_ld;
    float* d = dt + static_cast<size_t>(b) * vectors * dim;
    // Each element's sum over j in increasing order, from zero, as the
    // device's; k innermost, so the compiler vectorises it.
    for (int i = 0; i < vectors; ++i) {
      float* di = d + i * dim;
      std::fill(di, di + dim, 0.0f);
      for (int j = 0; j < vectors; ++j) {
        if (j == i) continue;
        const float gij = g[i > j ? i * (i - 1) / 2 + j : j * (j - 1) / 2 + i];
        const float* vj = v + j * dim;
        for (int k = 0; k < dim; ++k) di[k] += gij * vj[k];
      }
    }
  }
}

void BagsForward(const float* rows, const int32_t* row_of, const int32_t* offsets,
                 const float* dense, int batch, int fields, int dim, int dense_dim, bool mean,
                 float* x) {
  const size_t width = static_cast<size_t>(dense_dim) + static_cast<size_t>(fields) * dim;
  for (int b = 0; b < batch; ++b) {
    float* out = x + b * width;
    std::copy(dense + static_cast<size_t>(b) * dense_dim,
              dense + static_cast<size_t>(b + 1) * dense_dim, out);
    for (int f = 0; f < fields; ++f) {
      float* bag = out + dense_dim + static_cast<size_t>(f) * dim;
      std::fill(bag, bag + dim, 0.0f);
      const int32_t begin = offsets[b * fields + f], end = offsets[b * fields + f + 1];
      for (int32_t k = begin; k < end; ++k) {
        const float* row = rows + static_cast<size_t>(row_of[k]) * dim;
        for (int j = 0; j < dim; ++j) bag[j] += row[j];
      }
      if (mean && end - begin > 1) {
        const float inv = 1.0f / static_cast<float>(end - begin);
        for (int j = 0; j < dim; ++j) bag[j] *= inv;
      }
    }
  }
}

void BagsBackward(const float* dx, const int32_t* offsets, const int32_t* occ_start,
                  const int32_t* occ_bag, int unique, int fields, int dim, int dense_dim, bool mean,
                  float* row_grads) {
  const size_t width = static_cast<size_t>(dense_dim) + static_cast<size_t>(fields) * dim;
  for (int u = 0; u < unique; ++u) {
    float* acc = row_grads + static_cast<size_t>(u) * dim;
    std::fill(acc, acc + dim, 0.0f);
    for (int32_t t = occ_start[u]; t < occ_start[u + 1]; ++t) {
      const int32_t bag = occ_bag[t];
      const int32_t n = offsets[bag + 1] - offsets[bag];
      const float scale = mean && n > 1 ? 1.0f / static_cast<float>(n) : 1.0f;
      const float* g =
          dx + (bag / fields) * width + dense_dim + static_cast<size_t>(bag % fields) * dim;
      for (int j = 0; j < dim; ++j) acc[j] += scale * g[j];
    }
  }
}

}  // namespace cpu
}  // namespace pstrain
