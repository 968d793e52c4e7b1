// Products by a weight held as int8 codes with a float32 scale per block of 32 input features, w = d q, for float32
// rows x [M, K]: y[m, n] = sum_b d[n, b] sum_{j in b} q[n, j] x[m, j]. The same product as x W^T on the float32
// weight, up to float rounding order, wherever w = d q holds exactly: a GGUF's Q8_0 tensor dequantized to float32
// is such a weight (fp16 d times an int8 q needs 18 bits of mantissa: exact in float32), and the thin kernels.int8_codes
// checks it bit for bit before anything runs here.
//
// Why it exists: the bundled SmolLM2's tied head is Q8_0 in its GGUF; as float32 it is 113 MB of a 540 MB forward,
// and even read at memory speed those bytes cost. Its codes and scales are 31 MB, so read as codes it costs about
// a quarter. Unlike `@int4` nothing is rounded: activations stay float32, d is the GGUF's own scale.
//
// Layout: codes int8 [N, K] as the weight's rows, scales float32 [N, K / 32]. How: R output rows at a time, a
// block of 32 codes per row turned into floats once and met by up to MAX_M input rows, the block's sum scaled by
// d into a per-(row, input) accumulator; one horizontal sum per output at the end.
// The operators used, one header each (not ATen/ATen.h, which parses all of them: the build takes half as long).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <string>

namespace {

constexpr int BLOCK = 32;  // input features per scale (Q8_0's block)
constexpr int R = 4;       // output rows at once: four independent streams of codes

#if defined(__AVX512F__)
using vec = __m512;
constexpr int L = 16;
constexpr int MAX_M = 4;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset1(float v) { return _mm512_set1_ps(v); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(vec v) { return _mm512_reduce_add_ps(v); }
inline vec codes(const int8_t* p) {  // 16 int8 -> 16 floats
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int L = 8;
constexpr int MAX_M = 2;  // 16 registers: four input rows' features would not stay in them
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset1(float v) { return _mm256_set1_ps(v); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(vec v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
inline vec codes(const int8_t* p) {  // 8 int8 -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#else
#error "the thin kernels need AVX2 and FMA (cpu/matmul/thin_kernels.py does not build it elsewhere)"
#endif

constexpr int V = BLOCK / L;  // vectors per block

struct Int8 {
  const float* x;  // [M, K]
  const int8_t* q;  // [N, K]
  const float* d;  // [N, K / BLOCK]
  float* y;  // [M, N]
  int64_t K, N;
};

// Outputs n0 .. n0 + RR - 1 for input rows m0 .. m0 + M - 1
template <int RR, int M>
void tile(const Int8& a, int64_t n0, int64_t m0) {
  const int64_t blocks = a.K / BLOCK;
  vec acc[RR][M];
  for (int r = 0; r < RR; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int r = 0; r < RR; ++r) {
      const int8_t* q = a.q + (n0 + r) * a.K + b * BLOCK;
      _mm_prefetch(reinterpret_cast<const char*>(q) + 1024, _MM_HINT_T0);  // a prefetch never faults
      vec w[V];
      for (int v = 0; v < V; ++v) w[v] = codes(q + v * L);
      const vec d = vset1(a.d[(n0 + r) * blocks + b]);
      for (int m = 0; m < M; ++m) {
        const float* x = a.x + (m0 + m) * a.K + b * BLOCK;
        vec t = vmul(w[0], vload(x));
        for (int v = 1; v < V; ++v) t = vfma(w[v], vload(x + v * L), t);
        acc[r][m] = vfma(d, t, acc[r][m]);
      }
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int m = 0; m < M; ++m) a.y[(m0 + m) * a.N + n0 + r] = hsum(acc[r][m]);
}

template <int RR>
void rows(const Int8& a, int64_t n0, int64_t M) {
  for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {  // the outputs' codes stay in L1 for the next input rows
    const int64_t left = std::min<int64_t>(MAX_M, M - m0);
    if (left == 1) {
      tile<RR, 1>(a, n0, m0);
    } else if (left == 2) {
      tile<RR, 2>(a, n0, m0);
    } else if constexpr (MAX_M >= 4) {
      if (left == 3) tile<RR, 3>(a, n0, m0);
      else tile<RR, 4>(a, n0, m0);
    }
  }
}

at::Tensor int8_linear(const at::Tensor& x_in, const at::Tensor& q, const at::Tensor& d) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "thin kernels int8: x float32 [rows, in]");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(), "thin kernels int8: codes int8 [out, in]");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == K && K % BLOCK == 0, "thin kernels int8: in features a multiple of 32, as the codes'");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.sizes() == at::IntArrayRef({N, K / BLOCK}),
              "thin kernels int8: scales float32 [out, in / 32], contiguous");
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const Int8 a{x.data_ptr<float>(), q.data_ptr<int8_t>(), d.data_ptr<float>(), y.data_ptr<float>(), K, N};
  const int64_t tiles = (N + R - 1) / R;
  at::parallel_for(0, tiles, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * R;
      if (n0 + R <= N) {
        rows<R>(a, n0, M);
      } else {
        for (int64_t n = n0; n < N; ++n) rows<1>(a, n, M);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specview_thin, m) { m.def("int8_linear(Tensor x, Tensor codes, Tensor scales) -> Tensor"); }
TORCH_LIBRARY_IMPL(specview_thin, CPU, m) { m.impl("int8_linear", int8_linear); }
