"""@int4 on MPS (issue 43 item 3): torch's MPS int4 ops take the packing CUDA's do. No Mac here: this replays, on the
CPU, how torch's Metal code reads the bytes specview hands to aten._convert_weight_to_int4pack
(aten/src/ATen/native/mps/kernels/Quantized.metal: weight_to_int4pack swaps each byte's nibbles; int4pack_mm reads a
little-endian ushort at byte k / 2 of a row and takes its four nibbles, lowest first, as codes k..k+3, each scaled as
scale * q + (zero - 8 scale)), and checks that it multiplies by the matrix the codes stand for."""

import math

import torch

from specview.models.int4 import GROUP_SIZE, dequantize, device_bytes, device_tiles, quantize, split_halves


def mps_pack(data: torch.Tensor) -> torch.Tensor:
    """weight_to_int4pack: every byte with its two nibbles swapped, in place of the input's."""
    return (data & 15) << 4 | data >> 4


def mps_mm(x: torch.Tensor, packed: torch.Tensor, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """int4pack_mm in float32: code k of a row is the low nibble of its byte k // 2 for an even k, the high for odd."""
    n, half = packed.shape
    codes = torch.empty(n, 2 * half, dtype=torch.float32)
    codes[:, 0::2] = (packed & 15).float()
    codes[:, 1::2] = (packed >> 4).float()
    sz = scales_and_zeros.float().transpose(0, 1).repeat_interleave(group, dim=1)  # [N, K, 2]
    scale, zero = sz[..., 0], sz[..., 1] - 8 * sz[..., 0]
    return x.float() @ (codes * scale + zero).t()


def test_the_mps_kernel_reads_the_codes_pack_codes_hands_it():
    g = torch.Generator().manual_seed(0)
    n, k = 24, 4 * GROUP_SIZE
    codes, scales_and_zeros = quantize(torch.randn(n, k, generator=g), GROUP_SIZE)
    x = torch.randn(3, k, generator=g)  # three rows: a verify's M > 1 as well as a draft's one
    want = x @ dequantize(codes, scales_and_zeros, GROUP_SIZE).t()
    got = mps_mm(x, mps_pack(device_bytes(codes)), GROUP_SIZE, scales_and_zeros)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    # The replay tells layouts apart: specview's own halves (the CPU cache's order) would multiply other weights.
    wrong = mps_mm(x, mps_pack(split_halves(codes)), GROUP_SIZE, scales_and_zeros)
    assert not torch.allclose(wrong, want, rtol=1e-3, atol=1e-2)


def test_the_packed_tensor_holds_every_byte_the_mps_packer_writes():
    """MPS writes N * K / 2 bytes into an int32 tensor shaped as tinygemm's for the tiles given (torch's meta
    registration gives that shape): the tiles device_tiles picks must not make it smaller."""
    for n, k in [(8, 32), (16, 96), (576, 576), (1536, 576), (49152, 576)]:
        shape = torch.ops.aten._convert_weight_to_int4pack(torch.empty(n, k // 2, dtype=torch.uint8, device="meta"),
                                                          device_tiles(k)).shape
        assert math.prod(shape) * 4 == n * k // 2 and shape[0] == n // 8
