"""uint8 pixels (N, C, H, W) landed on a GPU become the model's input in one pass: each channel's plane
read with contiguous loads, scaled (``x * a + b``, float32 arithmetic) and written in the compute dtype
in the model's layout (channels_last or NCHW).

torch's own one-kernel form, ``addcmul(shift, pixels, factor, out=...)`` into a channels_last fp16
buffer, took 191 us a batch of 256 224x224 images on an H200, where page-locked float32's conversion
copy took 105 us: over two GPUs the pixel stream ran at 0.93x its run (BENCHMARKS.md 44). Its generic
elementwise kernel walks the output's strides element by element; this Triton kernel indexes the
planes directly: 77.5 us (BENCHMARKS.md 45). The stream stayed at 0.93-0.98x: its loss is the host's
staging copy of pageable pixels, not this conversion (pixels already page-locked streamed at 1.01-1.03x).
Where Triton is missing (a CPU-only torch) or the tensors are not on a CUDA device,
``scale_pixels`` falls back to that ``addcmul``: the same arithmetic, only slower.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

__all__ = ["scale_pixels", "triton_kernel"]

# pixels a program scales per channel: 1024 bytes of each plane in, four warps
_BLOCK = 1024


def scale_pixels(pixels: torch.Tensor, factor: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> None:
    """``out = pixels * factor + shift`` per channel, ``out`` in its own dtype and layout.

    ``pixels`` is contiguous uint8 (N, C, H, W); ``factor`` and ``shift`` hold C float32 values on its
    device; ``out`` has the same shape, laid out NCHW or channels_last (a leading slice of either).
    """
    kernel = triton_kernel() if pixels.is_cuda else None
    if kernel is None or not _plane_indexable(pixels, out):
        torch.addcmul(shift, pixels, factor, out=out)
        return
    n, channels, height, width = pixels.shape
    plane = height * width
    if n == 0:
        return
    blocks = -(-plane // _BLOCK)
    with torch.cuda.device(pixels.device):  # Triton launches on the current device's current stream
        kernel[(blocks * n,)](pixels, out, factor, shift, plane, blocks, out.stride(0), out.stride(3), out.stride(1),
                              CHANNELS=channels, BLOCK=_BLOCK)


def _plane_indexable(pixels: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether a pixel's place is ``h * W + w`` times one stride in both tensors (NCHW or channels_last
    rows; a strided view of anything else takes the fallback)."""
    if pixels.dtype != torch.uint8 or not pixels.is_contiguous() or out.shape != pixels.shape or out.dim() != 4:
        return False
    return out.stride(2) == out.shape[3] * out.stride(3) and out.device == pixels.device


@cache
def triton_kernel() -> Any | None:
    """The compiled-on-first-launch Triton kernel, or None where Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _scale(src, dst, factor, shift, plane, blocks, dst_image, dst_pixel, dst_channel,
               CHANNELS: tl.constexpr, BLOCK: tl.constexpr):
        program = tl.program_id(0)
        image = (program // blocks).to(tl.int64)
        pixel = (program % blocks) * BLOCK + tl.arange(0, BLOCK)
        inside = pixel < plane
        src_image = src + image * CHANNELS * plane
        dst_pixels = dst + image * dst_image + pixel.to(tl.int64) * dst_pixel
        for c in tl.static_range(CHANNELS):
            x = tl.load(src_image + c * plane + pixel, mask=inside).to(tl.float32)
            y = x * tl.load(factor + c) + tl.load(shift + c)
            tl.store(dst_pixels + c * dst_channel, y.to(dst.dtype.element_ty), mask=inside)

    return _scale
