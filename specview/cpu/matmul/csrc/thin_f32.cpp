// Thin float32 products y = x W^T for a few rows x [M, K] (a verify's K+1, a tree's nodes, one decoding row) by a
// weight W [N, K] laid out in panels: P output rows at a time, feature-major, [ceil(N / P), K, P] (pack_panels,
// zero rows past N). Built at first use by cpu/matmul/thin_kernels.py for the CPU in hand (-march=native), and run only where
// packed_linear's probe measures it faster than F.linear, oneDNN and MLAS.
//
// Why it exists: a verify reads every weight once, like a one-token step, so its products should cost about what
// one row costs. On some CPUs MKL's sgemm and oneDNN's packed product read the weights markedly slower for 5 rows
// than for one, so a verify costs well over a one-token step. The first
// version of this kernel read W in its own row-major layout and summed each output across a vector at the end:
// those horizontal sums (shuffles, on the port the multiply-adds need) held it to about half of the multiply-add peak.
//
// How: a vector lane per output row. For each input feature k the panel holds the P rows' weights side by side
// (two vectors), each input row's x[m, k] is broadcast, and 2 x M accumulators take the products: every weight
// is read once, from one contiguous stream per panel, and multiplied into all M rows; nothing is summed across
// lanes. Each output is summed in the order k = 0, 1, .. whatever M is, so a row's result does not depend on
// the rows beside it (bit for bit). Its cost grows slowly with the rows, where F.linear's grows fast: what
// must hold for a verify to cost about one row's reading of the weights (packed_linear's probe checks it per machine).
// The operators used, one header each (not ATen/ATen.h, which parses all of them: the build takes half as long).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/cat.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

namespace {

#if defined(__AVX512F__)
using vec = __m512;
constexpr int L = 16;
constexpr int MAX_M = 12;  // 2 x 12 accumulators + 2 weight vectors + a broadcast: 27 of 32 registers
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vset1(float v) { return _mm512_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int L = 8;
constexpr int MAX_M = 6;  // 2 x 6 + 2 + 1 = 15 of 16 registers
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vset1(float v) { return _mm256_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
#else
#error "the thin kernels need AVX2 and FMA (cpu/matmul/thin_kernels.py does not build it elsewhere)"
#endif

constexpr int P = 2 * L;  // output rows per panel: two vectors
// Bytes prefetched ahead of the multiply-adds: the hardware prefetcher alone left the stream short of the
// memory's pace at several rows; 4 to 16 KiB ahead did about equally well, 32 KiB worse.
constexpr int64_t AHEAD = 8192;

// Rows m0 .. m0 + M - 1 of x times one panel -> y's columns n0 .. n0 + P - 1 (fewer at the last panel: `width`).
template <int M>
void panel(const float* __restrict x, const float* __restrict w, float* __restrict y, int64_t K, int64_t N, int64_t n0, int64_t width) {
  vec lo[M], hi[M];
  for (int m = 0; m < M; ++m) lo[m] = hi[m] = vzero();
  const char* ahead = reinterpret_cast<const char*>(w) + AHEAD;  // past the panel's end: the thread's next panel
  for (int64_t k = 0; k < K; ++k) {
    if ((k & 1) == 0)  // two features' weights a time
      for (int c = 0; c < 2 * P * 4; c += 64) _mm_prefetch(ahead + k * P * 4 + c, _MM_HINT_T0);  // never faults
    const vec a = vload(w + k * P), b = vload(w + k * P + L);
    for (int m = 0; m < M; ++m) {
      const vec xv = vset1(x[m * K + k]);
      lo[m] = vfma(a, xv, lo[m]);
      hi[m] = vfma(b, xv, hi[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    if (width == P) {
      vstore(y + m * N + n0, lo[m]);
      vstore(y + m * N + n0 + L, hi[m]);
    } else {  // the last panel of an N that is not a multiple of P: its zero rows are not written
      alignas(64) float out[P];
      vstore(out, lo[m]);
      vstore(out + L, hi[m]);
      std::copy(out, out + width, y + m * N + n0);
    }
  }
}

using Panel = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <int... Ms>
constexpr auto table(std::integer_sequence<int, Ms...>) {
  return std::array<Panel, sizeof...(Ms)>{panel<Ms + 1>...};
}
constexpr auto PANELS = table(std::make_integer_sequence<int, MAX_M>{});

at::Tensor panel_linear(const at::Tensor& x_in, const at::Tensor& w_in, int64_t N) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat, "thin kernels: float32 only");
  TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 3 && w_in.size(2) == P && x_in.size(1) == w_in.size(1) &&
              w_in.size(0) == (N + P - 1) / P, "thin kernels: x [rows, in] and panels [ceil(out / ", P, "), in, ", P, "]");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // More rows than the registers hold go through in groups over each panel while it is in cache (L2 for a
  // 1536-feature panel), so the weights still come from memory once.
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * P, width = std::min<int64_t>(P, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
        const int64_t rows = std::min<int64_t>(MAX_M, M - m0);
        PANELS[rows - 1](xp + m0 * K, wp + p * K * P, yp + m0 * N, K, N, n0, width);
      }
    }
  });
  return y;
}

// W [N, K] -> panels [ceil(N / P), K, P], rows past N zero.
at::Tensor pack_panels(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.scalar_type() == at::kFloat && w_in.dim() == 2, "thin kernels: a float32 weight [out, in]");
  const int64_t N = w_in.size(0), K = w_in.size(1), panels = (N + P - 1) / P;
  at::Tensor w = w_in;
  if (panels * P != N) w = at::cat({w_in, at::zeros({panels * P - N, K}, w_in.options())});
  return w.reshape({panels, P, K}).transpose(1, 2).contiguous();
}

int64_t panel_rows() { return P; }

}  // namespace

TORCH_LIBRARY(specview_thin, m) {
  m.def("linear(Tensor x, Tensor panels, SymInt out_features) -> Tensor");
  m.def("pack_panels(Tensor w) -> Tensor");
  m.def("panel_rows() -> int", panel_rows);
}
TORCH_LIBRARY_IMPL(specview_thin, CPU, m) {
  m.impl("linear", panel_linear);
  m.impl("pack_panels", pack_panels);
}
