"""A weight-only int4 copy of a model: every layer matrix as 4-bit codes, run by torch's own int4 kernel (or, in
specview's fast forward, by the thin kernels' where it measures faster: the same codes, scales and activations).

Decoding reads every weight once per forward, so 4-bit weights are a cheap draft made from the target
itself. The kernel is `aten._weight_int4pack_mm_for_cpu` (what torchao's Int4CPULayout calls; torchao
is not needed): activations bfloat16 [M, K], weights packed from int32 codes [N, K] in 0..15, and
`scales_and_zeros` [K / group, N, 2] in bfloat16, one (scale, zero) per group of `group` consecutive
input features of an output row; it computes w = (q - 8) * scale + zero. Shape rules, CPU (checked on
torch 2.13): group in {32, 64, 128, 256}, K a multiple of group, N a multiple of 16.

Quantization is asymmetric min/max per group: d = (max - min) / 15, q = round((w - min) / d), scale = d,
zero = min + 8 d. The bundled SmolLM2 GGUF stores its layer matrices as Q4_1 blocks of 32 (w = d q + m,
q = 0 and q = 15 both present in each block), so min/max of transformers' float32 dequantization are
m and m + 15 d, and requantizing recovers the GGUF's own codes; only scale and zero get rounded to
bfloat16. Checked on the bundled model (gguf's GGUFReader, q/k rows put back in llama.cpp's rotary
order): the claim holds, the codes equal the GGUF's in all 210 layer matrices, every one of the 3.3M
blocks has both q = 0 and q = 15, and the bfloat16 scales are within 0.4% of the GGUF's float16 d.

CUDA and MPS have the same math as `aten._weight_int4pack_mm`, their weights packed by
`aten._convert_weight_to_int4pack` from the same input (pytorch#129940): uint8 [N, K / 2], code 2j in the high
nibble of byte j and code 2j + 1 in the low one (device_bytes). CUDA's is tinygemm (compute capability 8.0+); MPS's
packer swaps each byte's nibbles and its Metal kernel reads code k from the low nibble of byte k / 2, scaled as
(q - 8) * scale + zero, for bfloat16, which MPS has from macOS 14 (read in torch's
aten/src/ATen/native/mps/kernels/Quantized.metal; tests/models/test_int4_mps.py replays that reading). Both
branches are untested on a device (no GPU or Mac on the machine this was written on); other devices raise
SpecviewError.
"""

from __future__ import annotations

import copy
import functools
import os

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from specview.core.errors import SpecviewError
from specview.core.progress import in_tenths

# The version of what quantize, split_halves and pack_codes produce: the int4 copy's disk cache (models._int4_copy)
# keys its entries with it. Bump it with any change to those three, to _refit or to head_importance (its text: rows,
# tokens, seed), or a user's cache hands old codes to new code.
CODES_FORMAT = 3  # 2: a 4-bit head weighed by head_importance; 3: its centred fit
GROUP_SIZE = 32
GROUP_SIZES = (32, 64, 128, 256)  # the kernels accept no others
REFIT_ROWS = 4096  # output rows quantize() fits at a time: ~50 MB of temporaries for a 576-wide head, not ~0.6 GB
# The CPU packer works on 16 output rows at a time; tinygemm on 8; MPS's packed shape is CUDA's, [N / 8, ...]
N_MULTIPLE = {"cpu": 16, "cuda": 8, "mps": 8}
DEVICE_KERNELS = ("cuda", "mps")  # devices whose int4 ops are aten._convert_weight_to_int4pack / _weight_int4pack_mm
aten = torch.ops.aten


def quantize(weight: torch.Tensor, group_size: int = GROUP_SIZE,
             importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (float) -> (codes int32 [N, K] in 0..15, scales_and_zeros bfloat16 [K / group, N, 2]).

    Without `importance`: min/max per group, which gives back the codes of weights already on a 4-bit grid (a
    GGUF's). With `importance` [K] (what an error in each input feature costs: the mean square of the activations
    that meet it), each group's step and minimum are then refit to the weighted least squares of its codes, as
    llama.cpp's quantizers do with an importance matrix: the error goes where the activations are small."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    if importance is not None:
        importance = importance.detach().float().to(w.device)
        if importance.shape != (k,) or not torch.isfinite(importance).all() or (importance < 0).any():
            raise ValueError(f"importance must be {k} finite values >= 0, one per input feature")
        importance = importance.reshape(1, k // group_size, group_size)
        # Scaled per group to at most 1 (the fit does not change): sums of squares stay far from overflow
        importance = importance / importance.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        for rows in range(0, n, REFIT_ROWS):  # in slices: the fit's temporaries are each the size of its slice
            part = slice(rows, rows + REFIT_ROWS)
            d[part], lo[part] = _refit(w[part], d[part], lo[part], importance)
    # A group of equal weights has d = 0 and w - lo = 0 throughout: dividing by 1 there gives code 0, and zero =
    # min reproduces it exactly (no 0/0). In place after the first temporary: a start quantizes 135M weights.
    steps = (w - lo).div_(torch.where(d > 0, d, 1.0))
    codes = steps.round_().clamp_(0, 15).to(torch.int32).reshape(n, k)
    scales_and_zeros = torch.cat([d, lo + 8 * d], dim=-1).transpose(0, 1)  # [K / group, N, 2]
    return codes, scales_and_zeros.to(torch.bfloat16).contiguous()


def _refit(w: torch.Tensor, d: torch.Tensor, lo: torch.Tensor, importance: torch.Tensor, rounds: int = 4):
    """Alternate: codes for the current (d, lo), then the (d, lo) of least importance-weighted squared error for
    those codes: with weights u, d = sum u (q - mean q)(x - mean x) / sum u (q - mean q)^2 and lo = mean x - d mean q
    (weighted means; centred sums, which do not cancel as the raw 2x2 determinant does). Neither step can raise the
    weighted error. A group whose codes barely vary (no line to fit), whose fit would turn its step negative or is
    not finite keeps what it had."""
    weights = importance.expand_as(w)
    total = weights.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    mean_x = (weights * w).sum(-1, keepdim=True) / total
    for _ in range(rounds):
        q = ((w - lo) / torch.where(d > 0, d, 1.0)).round_().clamp_(0, 15)
        mean_q = (weights * q).sum(-1, keepdim=True) / total
        q -= mean_q
        spread = (weights * q * q).sum(-1, keepdim=True)
        new_d = (weights * q * (w - mean_x)).sum(-1, keepdim=True) / spread.clamp_min(torch.finfo(torch.float32).tiny)
        new_lo = mean_x - new_d * mean_q
        keep = (spread <= 1e-6 * total) | ~(new_d > 0) | ~torch.isfinite(new_lo)  # ~(x > 0): NaN too
        d, lo = torch.where(keep, d, new_d), torch.where(keep, lo, new_lo)
    return d, lo


def dequantize(codes: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """What the kernel multiplies by, in float32: w = (q - 8) * scale + zero, [N, K]."""
    n, k = codes.shape
    sz = scales_and_zeros.float().transpose(0, 1)  # [N, K / group, 2]
    q = codes.float().reshape(n, k // group_size, group_size)
    return ((q - 8) * sz[..., :1] + sz[..., 1:]).reshape(n, k)


def split_halves(codes: torch.Tensor) -> torch.Tensor:
    """codes int32 [N, K] -> uint8 [N, K / 2]: column j holds code j in its low nibble and code j + K/2 in its
    high one (half the memory of the codes; join_halves gives them back)."""
    half = codes.shape[1] // 2
    return (codes[:, :half] | codes[:, half:] << 4).to(torch.uint8).contiguous()


def join_halves(halves: torch.Tensor, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """split_halves' inverse: uint8 [N, K / 2] -> codes [N, K], int32 (torch's packer takes them) or `dtype`."""
    return torch.cat([(halves & 15).to(dtype), (halves >> 4).to(dtype)], dim=1)


def device_bytes(codes: torch.Tensor) -> torch.Tensor:
    """codes int32 [N, K] -> what CUDA's and MPS's packer takes: uint8 [N, K / 2], code 2j in the high nibble of
    byte j and code 2j + 1 in the low one (not split_halves' order, which is specview's own)."""
    return (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8).contiguous()


def device_tiles(k: int) -> int:
    """The inner k tiles _convert_weight_to_int4pack is given for K = k: tinygemm's layout; MPS only sizes its
    output by them (the same N * K / 2 bytes, nibbles swapped, in an int32 [N / 8, K / (16 tiles), 32, tiles / 2]).
    k % 32 == 0 always holds (group >= 32), so 2 fits at least."""
    return next(t for t in (8, 4, 2) if k % (16 * t) == 0)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    if codes.device.type in DEVICE_KERNELS:  # untested here: no GPU or Mac
        return aten._convert_weight_to_int4pack(device_bytes(codes), device_tiles(codes.shape[1]))
    return aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)  # the CPU packer ignores tiles


@functools.cache
def packed_row_block() -> int | None:
    """How many output rows the CPU packer lays out together (64 with AVX-512, torch 2.13), or None if it does
    not pack rows in independent blocks: then the packing of stacked codes is the stack of their packings
    whenever every part's rows are a multiple of it, and the engine's own forward fuses q/k/v and gate/up without unpacking.
    Probed on two small random blocks, once per process (microseconds), since the layout depends on the ISA."""
    g = torch.Generator().manual_seed(0)
    for rows in (16, 32, 64, 128, 256):
        parts = [torch.randint(0, 16, (rows, 64), dtype=torch.int32, generator=g) for _ in range(2)]
        if torch.equal(pack_codes(torch.cat(parts)), torch.cat([pack_codes(part) for part in parts])):
            return rows
    return None


class Int4Linear(nn.Module):
    """y = x @ W.T + b with W held as int4 codes; bfloat16 in and out. Built from an nn.Linear or from
    GPT-2's Conv1D (whose weight is stored transposed, [in, out])."""

    def __init__(self, linear: nn.Module, group_size: int = GROUP_SIZE, stored: tuple | None = None,
                 importance: torch.Tensor | None = None):
        """`stored`: (halves, scales_and_zeros, packed or None) from an earlier copy of this weight (the int4 copy's
        disk cache, on the CPU): the same codes without quantizing or packing again. `importance`: quantize()'s."""
        super().__init__()
        weight = linear.weight.t() if isinstance(linear, Conv1D) else linear.weight
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        if stored is None:
            codes, scales_and_zeros = quantize(weight, group_size, importance)
            packed = pack_codes(codes)
            # The codes themselves, two per byte, for the engine's own forward (which fuses q/k/v and gate/up by repacking them
            # where the packed parts cannot simply be stacked, packed_row_block): a plain attribute, not a
            # buffer, so the roofline counts only what a forward reads.
            halves = split_halves(codes) if codes.device.type == "cpu" else None
        else:
            halves, scales_and_zeros, packed = stored
            half = (self.out_features, self.in_features // 2)
            fits = (tuple(halves.shape) == half and halves.dtype == torch.uint8 and scales_and_zeros.dtype == torch.bfloat16
                    and tuple(scales_and_zeros.shape) == (self.in_features // group_size, self.out_features, 2)
                    and (packed is None or (tuple(packed.shape) == half and packed.dtype == torch.uint8)))
            if not fits:
                raise ValueError(f"stored codes of shape {tuple(halves.shape)} do not fit a "
                                 f"{self.out_features}x{self.in_features} weight")
            if packed is None:
                packed = pack_codes(join_halves(halves))
        self.register_buffer("packed", packed)
        self.halves = halves
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16, copy=True),
                                                             requires_grad=False)  # never the source's storage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        mm = aten._weight_int4pack_mm if x2.device.type in DEVICE_KERNELS else aten._weight_int4pack_mm_for_cpu
        y = mm(x2, self.packed, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


def to_device(model: nn.Module, device) -> nn.Module:
    """An int4 copy made on the host, on `device`: every Int4Linear's codes packed again for the device's kernel
    (the CPU's packing is not CUDA's), the rest moved as is. The halves stay on the host (the engine's own, CPU only)."""
    device = torch.device(device)
    for module in model.modules():
        if isinstance(module, Int4Linear) and module.packed.device != device and module.halves is not None:
            module.packed = pack_codes(join_halves(module.halves).to(device))
    return model.to(device)


def _linears(model: nn.Module, head: bool = False):
    """(name, module) of every layer matrix to quantize. The lm_head stays bfloat16 unless `head`: its
    error lands on the logits directly (measured on SmolLM2-135M: a 4-bit head makes the draft about 20% cheaper
    per token and drops greedy agreement with the target from 97.7% to 91.9%, head_importance)."""
    output = model.get_output_embeddings()
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, Conv1D)) and (head or module is not output):
            yield name, module


CALIBRATION_ROWS, CALIBRATION_TOKENS = 4, 32  # 128 sampled tokens: 4 x 64 or 1 x 128 measured no better


@torch.no_grad()
def head_importance(model: nn.Module, rows: int = CALIBRATION_ROWS, tokens: int = CALIBRATION_TOKENS,
                    seed: int = 0, context: int | None = None) -> torch.Tensor:
    """The mean square of each feature entering the output head [hidden], over text the model samples itself
    (temperature 1, from its BOS token, a seeded generator of its own: no data to ship, the global RNG untouched).

    It is the importance quantize() weighs a 4-bit head's error by. On the bundled SmolLM2-135M (the whole
    `@int4+head` draft against the target, 576 sampled positions of 12 built-in eval prompts, temperature 0.6) it
    raises sum(min(p, q)), the chance a draft is accepted, from 0.886 to 0.923, and greedy agreement from 86.6% to
    91.9% (`@int4`, the GGUF's own head: 0.981 and 97.7%); 4 x 64 or 1 x 128 calibration tokens did no better.
    32 forwards of 4 rows, seconds on a CPU: once for a GGUF, whose codes are cached with the converted
    model (docs/design/models.md); at every start for a hub model or a folder, and with --no-cache. The start token is
    the BOS, else the EOS, else 0. The model is put in eval mode meanwhile (dropout would draw from the global RNG
    and change the text), then back in the mode it was in."""
    tokens = min(tokens, context or tokens)  # `context`: the model's positions (models.context_length), None = any
    head = model.get_output_embeddings()
    device = head.weight.device
    squares: list[torch.Tensor] = []
    generator = torch.Generator(device).manual_seed(seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    start = next((t for t in (model.config.bos_token_id, model.config.eos_token_id)
                  if isinstance(t, int) and 0 <= t < vocab), 0)
    ids = torch.full((rows, 1), start, dtype=torch.long, device=device)
    past = None
    training = model.training
    hook = head.register_forward_pre_hook(lambda _module, args: squares.append(args[0].float().pow(2).sum((0, 1))))
    try:
        model.eval()
        for _ in range(tokens):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            ids = torch.multinomial(probs, 1, generator=generator)
    finally:
        hook.remove()
        model.train(training)
    return torch.stack(squares).sum(0) / (rows * tokens)


def _shape(module: nn.Module) -> tuple[int, int]:
    """(in_features, out_features); Conv1D keeps only nf (= out) and its weight is [in, out]."""
    if isinstance(module, Conv1D):
        return module.weight.shape[0], module.nf
    return module.in_features, module.out_features


def device_problem(device) -> str | None:
    """Why @int4 cannot run on `device` (one line), or None: known before any model is loaded."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "@int4 has no kernel for device cuda here: CUDA is not available in this torch"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:  # tinygemm uses bfloat16 tensor cores
            return f"@int4 has no kernel for device cuda here: needs compute capability 8.0+, got {major}.{minor}"
    elif device.type == "mps":
        if not _macos_14():  # the int4 copy runs in bfloat16, which MPS has from macOS 14
            return "@int4 has no kernel for device mps here: it runs in bfloat16, which MPS has from macOS 14"
    elif device.type != "cpu":
        return (f"@int4 has no kernel for device {device.type} here: torch's int4 matmul runs on CPU, CUDA (8.0+) "
                "and MPS only; use --device cpu or another --draft")
    return None


def _macos_14() -> bool:
    try:
        return torch.backends.mps.is_macos_or_newer(14, 0)
    except (AttributeError, RuntimeError):  # no MPS backend in this torch
        return False


def default_problem(device) -> str | None:
    """Why the default draft is not an @int4 copy on `device`, or None. MPS runs an @int4 spec given to it, but its
    kernel has never run on a Mac: the default stays the float16 copy there until `make gpu-smoke` has passed on
    one (docs/guide/gpu.md)."""
    problem = device_problem(device)
    if problem is None and torch.device(device).type == "mps":
        return "@int4 runs on mps only when asked: its kernel has not run on a Mac yet"
    return problem


def check_int4_supported(model: nn.Module, device, group_size: int = GROUP_SIZE, head: bool = False) -> None:
    """Raise SpecviewError (one line) if `model` cannot run as an int4 copy on `device`."""
    device = torch.device(device)
    problem = device_problem(device)
    if problem:
        raise SpecviewError(problem)
    if group_size not in GROUP_SIZES:
        raise SpecviewError(f"int4 group size {group_size} is not supported: use one of {GROUP_SIZES}")
    tile = N_MULTIPLE[device.type]
    for name, module in _linears(model, head):
        k, n = _shape(module)
        if k % group_size:
            raise SpecviewError(f"{name}: in_features {k} is not a multiple of the int4 group size {group_size}")
        if n % tile:
            raise SpecviewError(f"{name}: out_features {n} is not a multiple of {tile}, as the int4 kernel "
                                f"on {device.type} needs")


CODES_FILE = "int4.safetensors"


def save_codes(int4: nn.Module, folder) -> None:
    """Every Int4Linear's codes (two per byte) and scales of an int4 copy, for int4_copy(stored=) to read back."""
    from safetensors.torch import save_file

    tensors = {}
    for name, module in int4.named_modules():
        if isinstance(module, Int4Linear):
            tensors[f"{name}.halves"] = module.halves
            tensors[f"{name}.scales_and_zeros"] = module.scales_and_zeros
            tensors[f"{name}.packed"] = module.packed
    save_file(tensors, os.path.join(folder, CODES_FILE))


def load_codes(folder) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """save_codes' file -> {module name: (halves, scales_and_zeros, packed)}. The packed codes are in the layout of
    the CPU kernel that packed them: the cache key names that kernel (torch's CPU capability and version)."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, CODES_FILE))
    names = {key.rsplit(".", 1)[0] for key in tensors}
    return {name: tuple(tensors[f"{name}.{part}"] for part in ("halves", "scales_and_zeros", "packed"))
            for name in names}


def int4_copy(model: nn.Module, group_size: int = GROUP_SIZE, head: bool = False,
              stored: dict | None = None, context: int | None = None, say=lambda msg: None) -> nn.Module:
    """A deep copy of `model` (a transformers CausalLM) whose linear layers (nn.Linear, and GPT-2's
    transformers.pytorch_utils.Conv1D, whose weight is stored transposed [in, out]) are replaced by an
    Int4Linear module; everything else (embeddings, norms, and the lm_head, tied or not) is bfloat16.
    With `head`, the lm_head is an Int4Linear too (untied: the input embedding stays a bfloat16 lookup), its codes
    fit to the activations the model itself produces (head_importance: 4 x 32 sampled tokens).
    The input model is not modified. `stored` (load_codes of an earlier copy of the same weights, the same group
    size and head) gives every matrix its codes without quantizing: the same copy, sooner. `say` hears the share of
    matrices done, in tenths."""
    check_int4_supported(model, next(model.parameters()).device, group_size, head)
    # The copy is made without copying a weight twice: the matrices about to be replaced are read, not copied (the
    # copy's modules point at the source's until their Int4Linear replaces them; a full copy of them cost every
    # start time), and every other parameter (the embedding, the norms) enters the copy already bfloat16, as the cast
    # at the end would leave it (a float32 copy of the 113 MB embedding and then its cast cost time and memory). The codes
    # are made from the source's modules, in the source's precision (float32 for the GGUF model: that is what
    # makes them come back exactly), also for a head tied to the embedding, whose copy is bfloat16 by then. A copy
    # even of a bfloat16 source (copy=True): the draft must never share a tensor with the target it came from.
    replaced = {id(m): m for _, m in _linears(model, head)}
    kept = {id(p) for m in model.modules() if id(m) not in replaced for p in m.parameters(recurse=False)}
    memo = {id(m.weight): m.weight for m in replaced.values() if id(m.weight) not in kept}
    for p in model.parameters():
        if id(p) in kept and p.is_floating_point():
            memo[id(p)] = nn.Parameter(p.detach().to(torch.bfloat16, copy=True), requires_grad=p.requires_grad)
    int4 = copy.deepcopy(model, memo)
    if head:
        int4.config.tie_word_embeddings = False  # the embedding keeps its bfloat16 rows, the head its codes
    names = [name for name, _ in _linears(int4, head)]
    if stored is not None and set(stored) != set(names):
        raise ValueError("the stored codes are for other matrices")
    output = int4.get_output_embeddings()
    # Only the head gets an importance: a layer matrix's min/max codes are the GGUF's own (`@int4` keeps them).
    importance = head_importance(model, context=context) if head and stored is None else None
    for name in in_tenths(names, say, "int4 copy", "matrices"):
        parent_name, _, child = name.rpartition(".")
        is_head = int4.get_submodule(name) is output
        setattr(int4.get_submodule(parent_name), child,
                Int4Linear(model.get_submodule(name), group_size, None if stored is None else stored[name],
                           importance if is_head else None))
    # Parameters only, as from_pretrained(dtype=bfloat16) does: buffers such as Llama's rotary
    # inv_freq stay float32. parameters() yields a tied embedding once; .data keeps the tie.
    for p in int4.parameters():
        p.data = p.data.to(torch.bfloat16)
    int4.config.dtype = torch.bfloat16
    return int4.eval()
