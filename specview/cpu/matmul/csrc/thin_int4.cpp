// Thin products by a weight of 4-bit codes, y = x W^T for a few rows x [M, K] (a draft's one token, a catch-up,
// a tree's level), where W = (q - 8) * scale + zero per group of G input features of an output row, scale and
// zero bfloat16: the weight torch's int4 kernel (aten._weight_int4pack_mm_for_cpu) multiplies by, and its
// activations rounded to bfloat16 as that kernel's are. The same product up to float rounding order: each group's
// sum of q x is scaled once, y = sum_g scale_g * sum q x + (zero_g - 8 scale_g) * sum x, instead of each weight
// being dequantized.
//
// Why it exists: on some CPUs torch's int4 kernel takes most of an int4 draft's one-token forward and reads its
// codes well below the memory's pace. Most of its work is turning codes into numbers; here one conversion serves
// 16 output rows at once.
//
// Layout (cpu/matmul/thin_kernels.py's pack_int4): output rows in blocks of 16, input features in chunks of 8. codes uint8
// [N/16, K/8, 64]: in a chunk, row i's 4 bytes (a little-endian 32-bit word) hold its even features' codes in the
// low 16 bits and its odd features' in the high 16, 4 bits each, feature 0 lowest. scales bfloat16
// [N/16, K/G, 2, 16]: per group, the block's 16 scales, then its 16 zeros. A block's codes are one stream.
//
// How: a vector lane per output row (16 with AVX-512, 8 with AVX2, which takes a block in two halves). A chunk is
// one load; its codes become numbers once (decode) and meet every input row (mac). Group sums are scaled into
// the output at group ends. More rows than MAX_M go through in groups of MAX_M over each block while its codes are
// in cache (packed_linear's probe runs it only where it measures faster than torch's kernel).
// The operators used, one header each (not ATen/ATen.h, which parses all of them: the build takes half as long).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int ROWS = 16;          // output rows per block (the layout's)
constexpr int CHUNK = 64;         // bytes per 8 features of a block
constexpr int MAX_M = 4;          // input rows in registers at once
constexpr int64_t AHEAD = 4096;   // bytes of codes prefetched ahead (1-8 KiB tried; 4 best where measured)

#if defined(__AVX512F__)
using vec = __m512;
constexpr int L = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset1(float v) { return _mm512_set1_ps(v); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vfnma(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline void vstore(uint16_t* p, vec v) {  // rounded to bfloat16, to nearest even (as c10::BFloat16)
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline vec bf16s(const uint16_t* p) {  // L bfloat16 -> float32 (exact: the high half of a float)
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
// The codes of a chunk's 8 features for L lanes as floats, f[i] for feature i
inline void features(const uint8_t* p, vec f[8]) {
  const __m512i d = _mm512_loadu_si512(p), low = _mm512_set1_epi32(15);
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(d, 4 * j), low));
    f[2 * j + 1] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(d, 16 + 4 * j), low));
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int L = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset1(float v) { return _mm256_set1_ps(v); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vfnma(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline void vstore(uint16_t* p, vec v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0b1000);  // 8 words in the low half
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline vec bf16s(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline void features(const uint8_t* p, vec f[8]) {
  const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), low = _mm256_set1_epi32(15);
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(d, 4 * j), low));
    f[2 * j + 1] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(d, 16 + 4 * j), low));
  }
}
#else
#error "the thin kernels need AVX2 and FMA (cpu/matmul/thin_kernels.py does not build it elsewhere)"
#endif

// The operands of one product, in the layout above. x: the input rows rounded to bfloat16, as bfloat16 (xb) and
// as floats (xf, the float32 path's); xsum: each row's sum per group [M, K/G].
struct Int4 {
  const uint16_t* xb;
  const float* xf;
  const float* xsum;
  const uint8_t* codes;
  const uint16_t* scales;
  void* y;  // [M, N], float32 or (y_bf16) bfloat16
  bool y_bf16;
  int64_t K, N, G;
};

#if defined(__AVX512BF16__)
// With AVX512_BF16 one instruction multiplies 16 lanes' pairs of bfloat16 and adds both products: 32
// multiply-adds. A code q becomes the bfloat16 of 128 + q by one bitwise operation (0x4300 | q: 128 has 7 bits
// of mantissa below it), exact, as are the activations (bfloat16 already) and their products in float32; the
// group's end takes 128 scale sum x back out. Per chunk: one 64-byte load, 3 shifts, 4 bitwise operations,
// 4 dot products, no shuffle (a widening load and a vpermw table lookup per pair of features ran at half this
// speed: both take the core's one shuffle port).
constexpr float BIAS = 128.0f;
constexpr int DECODED = 4;  // vectors per decoded chunk: features (0, 1), (2, 3), (4, 5), (6, 7) as bfloat16 pairs
using coded = __m512i;
inline void decode(const uint8_t* p, int, coded q[DECODED]) {
  const __m512i w = _mm512_loadu_si512(p), low = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
  q[0] = _mm512_ternarylogic_epi32(w, low, bias, 0xEA);  // (w & low) | bias
  q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(w, 4), low, bias, 0xEA);
  q[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(w, 8), low, bias, 0xEA);
  q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(w, 12), low, bias, 0xEA);
}
inline int32_t pair(const uint16_t* p) {  // two bfloat16 as one 32-bit word (memcpy: no aliasing, any alignment)
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// acc[m] += the chunk's codes times rows m0 + m's features f .. f + 7
template <int M, int S>
inline void mac(const coded* q, const Int4& a, int64_t m0, int64_t f, vec acc[M][S]) {
  for (int m = 0; m < M; ++m) {
    const uint16_t* x = a.xb + (m0 + m) * a.K + f;
    for (int j = 0; j < DECODED; ++j)
      acc[m][j % S] = _mm512_dpbf16_ps(acc[m][j % S], (__m512bh)q[j], (__m512bh)_mm512_set1_epi32(pair(x + 2 * j)));
  }
}
#else
// Elsewhere: the codes as float32 (shifts, masks, conversions) and a multiply-add per feature and row.
constexpr float BIAS = 0.0f;
constexpr int DECODED = 8;
using coded = vec;
inline void decode(const uint8_t* p, int half, coded f[DECODED]) { features(p + half * 4 * L, f); }
template <int M, int S>
inline void mac(const coded* q, const Int4& a, int64_t m0, int64_t f, vec acc[M][S]) {
  for (int m = 0; m < M; ++m) {
    const float* x = a.xf + (m0 + m) * a.K + f;
    for (int i = 0; i < DECODED; ++i) acc[m][i % S] = vfma(q[i], vset1(x[i]), acc[m][i % S]);
  }
}
#endif

// Independent sums per row, so that the multiply-adds do not wait on each other (4-5 cycles each): one sum
// per row ran at half the speed. AVX2 has 16 registers.
template <int M>
constexpr int sums() { return L == 16 || M == 1 ? 4 : 2; }

// The group's scale and offset for lanes `half * L ..` of a block: w = q scale + zero - 8 scale, and sums of
// (BIAS + q) x need BIAS scale sum x taken back out.
inline void scale_offset(const uint16_t* s, vec& scale, vec& offset) {
  scale = bf16s(s);
  offset = vfnma(vset1(8.0f + BIAS), scale, bf16s(s + ROWS));
}

template <int M, int S>
inline void add_group(const Int4& a, vec acc[M][S], vec scale, vec offset, int64_t g, int64_t m0, vec y[M]) {
  const int64_t groups = a.K / a.G;
  for (int m = 0; m < M; ++m) {
    vec sum = acc[m][0];
    for (int i = 1; i < S; ++i) sum = vadd(sum, acc[m][i]);
    y[m] = vfma(scale, sum, y[m]);
    y[m] = vfma(offset, vset1(a.xsum[(m0 + m) * groups + g]), y[m]);
  }
}

inline void store(const Int4& a, int64_t m, int64_t b, int half, vec y) {
  const int64_t at = m * a.N + b * ROWS + half * L;
  if (a.y_bf16) vstore(static_cast<uint16_t*>(a.y) + at, y);
  else vstore(static_cast<float*>(a.y) + at, y);
}

// Lanes `half * L ..` of block b for M <= MAX_M input rows (from row m0), each chunk decoded in registers.
template <int M>
inline void block(const Int4& a, int64_t b, int half, int64_t m0) {
  constexpr int S = sums<M>();
  const int64_t groups = a.K / a.G;
  const uint8_t* c = a.codes + b * (a.K / 8) * CHUNK;
  const uint16_t* s = a.scales + b * groups * 2 * ROWS + half * L;
  vec y[M];
  for (int m = 0; m < M; ++m) y[m] = vzero();
  for (int64_t g = 0; g < groups; ++g) {
    vec acc[M][S];
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < S; ++i) acc[m][i] = vzero();
    for (int64_t ch = 0; ch < a.G / 8; ++ch) {
      const uint8_t* p = c + (g * (a.G / 8) + ch) * CHUNK;
      _mm_prefetch(reinterpret_cast<const char*>(p) + AHEAD, _MM_HINT_T0);  // a prefetch never faults
      coded q[DECODED];
      decode(p, half, q);
      mac<M, S>(q, a, m0, g * a.G + 8 * ch, acc);
    }
    vec scale, offset;
    scale_offset(s + g * 2 * ROWS, scale, offset);
    add_group<M, S>(a, acc, scale, offset, g, m0, y);
  }
  for (int m = 0; m < M; ++m) store(a, m0 + m, b, half, y[m]);
}

using Block = void (*)(const Int4&, int64_t, int, int64_t);
constexpr Block BLOCKS[MAX_M] = {block<1>, block<2>, block<3>, block<4>};

void run(const Int4& a, int64_t M) {
  at::parallel_for(0, a.N / ROWS, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int half = 0; half < ROWS / L; ++half)
        for (int64_t m0 = 0; m0 < M; m0 += MAX_M)  // the block's codes stay in L1/L2 for the next rows
          BLOCKS[std::min<int64_t>(MAX_M, M - m0) - 1](a, b, half, m0);
  });
}

at::Tensor int4_linear(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& scales, int64_t G) {
  TORCH_CHECK(x_in.dim() == 2, "thin kernels int4: x [rows, in]");
  TORCH_CHECK(x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kFloat,
              "thin kernels int4: x bfloat16 or float32");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 3 && codes.size(2) == CHUNK && codes.is_contiguous(),
              "thin kernels int4: codes uint8 [out/16, in/8, 64], contiguous");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = codes.size(0) * ROWS;
  TORCH_CHECK(G > 0 && G % 8 == 0 && K % G == 0 && codes.size(1) * 8 == K,
              "thin kernels int4: in features a multiple of the group size (a multiple of 8), codes [out/16, in/8, 64]");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.sizes() == at::IntArrayRef({N / ROWS, K / G, 2, ROWS}),
              "thin kernels int4: scales bfloat16 [out/16, in/group, 2, 16], contiguous");
  // The activations as torch's int4 kernel takes them, rounded to bfloat16 (bfloat16 ones are read in place), and
  // their sums per group, in plain loops: ATen calls for these cost a visible share of a draft's forward
  const at::Tensor x = x_in.contiguous();
  const int64_t groups = K / G;
  const bool bf = x.scalar_type() == at::kBFloat16;
  std::vector<uint16_t> rounded(bf ? 0 : M * K);
  if (!bf) {
    const float* from = x.data_ptr<float>();
    for (int64_t i = 0; i < M * K; ++i) rounded[i] = c10::BFloat16(from[i]).x;
  }
  const uint16_t* xb = bf ? reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) : rounded.data();
  std::vector<float> xf(M * K), xsum(M * groups);
  for (int64_t i = 0; i < M * K; ++i) {
    const uint32_t word = static_cast<uint32_t>(xb[i]) << 16;
    std::memcpy(&xf[i], &word, 4);
  }
  for (int64_t j = 0; j < M * groups; ++j) {
    float sum = 0.0f;
    for (int64_t i = 0; i < G; ++i) sum += xf[j * G + i];
    xsum[j] = sum;
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M > 0 && N > 0) {
    const Int4 a{xb, xf.data(), xsum.data(), codes.data_ptr<uint8_t>(),
                 reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>()), y.data_ptr(), bf, K, N, G};
    run(a, M);
  }
  return y;
}

// Which of the paths above this build runs (for the tests, and for whoever reads a figure)
std::string int4_path() {
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(__AVX512F__)
  return "avx512";
#else
  return "avx2";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specview_thin, m) {
  m.def("int4_linear(Tensor x, Tensor codes, Tensor scales, int group) -> Tensor");
  m.def("int4_path() -> str", int4_path);
}
TORCH_LIBRARY_IMPL(specview_thin, CPU, m) { m.impl("int4_linear", int4_linear); }
