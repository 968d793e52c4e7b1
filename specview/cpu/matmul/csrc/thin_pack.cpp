// The int4 kernel's layout of codes (cpu/matmul/csrc/thin_int4.cpp's comment; cpu/matmul/thin_kernels.py's pack_int4), made in one pass:
// every start with an int4 draft on that kernel packs its codes (135M for the bundled model), and torch's
// elementwise operators, in strided passes, made that a visible part of a warm start.
//
// codes uint8 [N, K] (0..15) -> uint8 [N/16, K/8, 64]: for output row r = 16 b + i and the 8 features from 8 g,
// bytes 4 i .. 4 i + 3 of chunk [b, g] are c0 | c2 << 4, c4 | c6 << 4, c1 | c3 << 4, c5 | c7 << 4 (c_j: the code of
// feature 8 g + j), i.e. the even features' codes in the word's low 16 bits and the odd ones' in its high 16.
// The operators used, one header each (not ATen/ATen.h, which parses all of them: the build takes half as long).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace {

at::Tensor pack_int4_codes(const at::Tensor& codes_in) {
  TORCH_CHECK(codes_in.dim() == 2 && codes_in.scalar_type() == at::kByte, "pack_int4_codes: codes uint8 [N, K]");
  const at::Tensor codes = codes_in.contiguous();
  const int64_t N = codes.size(0), K = codes.size(1);
  TORCH_CHECK(N % 16 == 0 && K % 8 == 0, "pack_int4_codes: N a multiple of 16, K of 8; got ", N, "x", K);
  at::Tensor out = at::empty({N / 16, K / 8, 64}, codes.options());
  const uint8_t* c = codes.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 16, 1, [&](int64_t b0, int64_t b1) {  // whole blocks: no 64-byte chunk shared by threads
    for (int64_t r = b0 * 16; r < b1 * 16; ++r) {
      const uint8_t* row = c + r * K;
      uint8_t* dst = o + (r / 16) * (K / 8) * 64 + (r % 16) * 4;
      for (int64_t g = 0; g < K / 8; ++g, row += 8, dst += 64) {
        dst[0] = row[0] | row[2] << 4;
        dst[1] = row[4] | row[6] << 4;
        dst[2] = row[1] | row[3] << 4;
        dst[3] = row[5] | row[7] << 4;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specview_thin, m) { m.def("pack_int4_codes(Tensor codes) -> Tensor"); }
TORCH_LIBRARY_IMPL(specview_thin, CPU, m) { m.impl("pack_int4_codes", pack_int4_codes); }
