// Thin float32 products y = x W^T for a few rows x [M, K] (a verify's K+1, a tree's nodes) by a weight W [N, K]
// in its own row-major layout: no packed copy. Built at first use by thinmm.py for the CPU in hand
// (-march=native), and run only where fastlinear's probe measures it faster than F.linear, oneDNN and MLAS.
//
// Why it exists: a verify reads every weight once, like a one-token step, so its products should cost about
// what one row costs. On a 2-vCPU Xeon (Emerald Rapids) oneDNN's packed product, MKL's sgemm and MLAS all read
// the weights at 15-19 GB/s for 5 rows, where MKL's one-row sgemv reads them at 31 (the memory's pace).
//
// How: each thread takes blocks of B output rows; for each 16 (AVX-512) or 8 (AVX2) input features it loads B
// weight vectors and M <= 5 input vectors and keeps B x M accumulators in registers (20 of 32 for 4 x 5), so every
// weight is read once and multiplied into all M rows. A block first prefetches the weights PREFETCH bytes ahead:
// the hardware prefetcher alone left the 5-row product at 18 GB/s there, with it 23-26.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <immintrin.h>

namespace {

constexpr int64_t PREFETCH = 8192;  // bytes ahead; 2-16 KiB measured, 8 KiB best
constexpr int MAX_M = 5;            // rows in registers at once; more rows go through in groups (grouped)

#if defined(__AVX512F__)
using vec = __m512;
constexpr int L = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vec a) { return _mm512_reduce_add_ps(a); }
constexpr int blocks_for(int) { return 4; }  // B x M + B + 1 registers of 32 for M <= 5
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int L = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}
constexpr int blocks_for(int m) { return m <= 2 ? 4 : 2; }  // of 16 registers, M <= 5
#else
#error "thinmm needs AVX2 and FMA (thinmm.py does not build it elsewhere)"
#endif

// Output rows n .. n + B - 1 for all M input rows. Features past the last full vector: scalar.
template <int M, int B>
inline void block(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n) {
  vec acc[B][M];
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = vzero();
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    vec wv[B];
    for (int j = 0; j < B; ++j) wv[j] = vload(w + (n + j) * K + k);
    for (int m = 0; m < M; ++m) {
      vec xv = vload(x + m * K + k);
      for (int j = 0; j < B; ++j) acc[j][m] = vfma(wv[j], xv, acc[j][m]);
    }
  }
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m) {
      float s = vsum(acc[j][m]);
      for (int64_t t = k; t < K; ++t) s += w[(n + j) * K + t] * x[m * K + t];
      y[m * N + n + j] = s;
    }
}

template <int M>
void pass(const float* x, const float* w, float* y, int64_t K, int64_t N) {
  constexpr int B = blocks_for(M);
  const int64_t blocks = N / B;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const char* ahead = reinterpret_cast<const char*>(w + b * B * K) + PREFETCH;
      for (int64_t o = 0; o < B * K * 4; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);  // never faults
      block<M, B>(x, w, y, K, N, b * B);
    }
  });
  for (int64_t n = blocks * B; n < N; ++n) block<M, 1>(x, w, y, K, N, n);
}

// More rows than MAX_M (a 9-row verify at K=8, a tree, a prefill): groups of at most MAX_M rows meet each block of
// weight rows while it is in L1, so the weights still come from memory once. Measured on the Xeon, all of a
// SmolLM2's matrices: one pass of 8 rows in registers took 37 ms, 9 rows 43 (as 8 + 1); groups of 5 reuse the
// kernel that reads 5 rows at 23-26 GB/s.
constexpr int GB = blocks_for(MAX_M);
template <int M>
inline void group(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n) {
  block<M, GB>(x, w, y, K, N, n);
}
template <int M>
inline void group_tail(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n) {
  block<M, 1>(x, w, y, K, N, n);
}
using Group = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t);
constexpr Group GROUPS[MAX_M] = {group<1>, group<2>, group<3>, group<4>, group<5>};
constexpr Group TAILS[MAX_M] = {group_tail<1>, group_tail<2>, group_tail<3>, group_tail<4>, group_tail<5>};

void grouped(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = N / GB;
  auto each_group = [&](const Group* table, int64_t n) {
    for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
      const int64_t rows = std::min<int64_t>(MAX_M, M - m0);
      table[rows - 1](x + m0 * K, w, y + m0 * N, K, N, n);
    }
  };
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const char* ahead = reinterpret_cast<const char*>(w + b * GB * K) + PREFETCH;
      for (int64_t o = 0; o < GB * K * 4; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
      each_group(GROUPS, b * GB);
    }
  });
  for (int64_t n = blocks * GB; n < N; ++n) each_group(TAILS, n);
}

using Pass = void (*)(const float*, const float*, float*, int64_t, int64_t);
constexpr Pass PASSES[MAX_M] = {pass<1>, pass<2>, pass<3>, pass<4>, pass<5>};

at::Tensor thin_linear(const at::Tensor& x_in, const at::Tensor& w_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat, "thinmm: float32 only");
  TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 2 && x_in.size(1) == w_in.size(1),
              "thinmm: x [rows, in] and w [out, in]");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (M <= MAX_M) {
    PASSES[M - 1](x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), K, N);
  } else {
    grouped(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), M, K, N);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(specview_thinmm, m) { m.def("linear(Tensor x, Tensor w) -> Tensor"); }
TORCH_LIBRARY_IMPL(specview_thinmm, CPU, m) { m.impl("linear", thin_linear); }
