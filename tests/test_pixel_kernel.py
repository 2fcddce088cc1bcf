"""uint8 pixels scaled into a model's input in one pass: the Triton kernel on a GPU, ``addcmul`` where
Triton or CUDA is missing; both against the host's ``PixelScale.apply``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autohet.core.workload import PixelScale
from autohet.executors.pixel_kernel import scale_pixels, triton_kernel

IMAGENET = PixelScale((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _scaled(pixels: np.ndarray, scale: PixelScale, dtype: torch.dtype, layout: torch.memory_format,
            device: str, rows: int | None = None) -> torch.Tensor:
    """``scale_pixels`` into a fresh ``dtype`` buffer in ``layout`` (its first ``rows`` images only where
    given: a leading slice, as a partial batch is written)."""
    a, b = (torch.from_numpy(f).to(device) for f in scale.factors())
    src = torch.from_numpy(pixels).to(device)
    out = torch.full(src.shape, -7.0, dtype=dtype, device=device).contiguous(memory_format=layout)
    n = src.shape[0] if rows is None else rows
    scale_pixels(src[:n], a, b, out[:n])
    return out


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
def test_the_fallback_scales_as_the_host_does_in_either_layout(layout):
    pixels = np.random.default_rng(0).integers(0, 256, (5, 3, 9, 7), dtype=np.uint8)
    out = _scaled(pixels, IMAGENET, torch.float32, layout, "cpu", rows=4)
    assert out.is_contiguous(memory_format=layout)
    np.testing.assert_allclose(out[:4].numpy(), IMAGENET.apply(pixels[:4]), rtol=1e-6, atol=1e-5)
    assert (out[4] == -7.0).all()  # exact: rows past the slice are left as they were


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype", "layout", "rows"), [
    ((8, 3, 224, 224), torch.float16, torch.channels_last, None),  # whole 1024-pixel blocks
    ((8, 3, 37, 23), torch.float16, torch.channels_last, 5),  # a partial block, a leading slice
    ((4, 3, 37, 23), torch.bfloat16, torch.contiguous_format, None),
    ((4, 1, 28, 28), torch.float32, torch.channels_last, 3),  # one channel
])
def test_the_triton_kernel_scales_as_the_host_does(shape, dtype, layout, rows):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    assert triton_kernel() is not None, "a CUDA torch without Triton: the executor would fall back to addcmul"
    scale = IMAGENET if shape[1] == 3 else PixelScale((0.45,), (0.23,))
    pixels = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    n = shape[0] if rows is None else rows
    out = _scaled(pixels, scale, dtype, layout, "cuda", rows=rows).float().cpu()
    expected = torch.from_numpy(scale.apply(pixels[:n])).to(dtype).float()  # float32, then rounded once
    eps = torch.finfo(dtype).eps  # a rounding apart: x * a + b against the host's (x / 255 - mean) / std
    torch.testing.assert_close(out[:n], expected, rtol=8 * eps, atol=8 * eps)
    assert (out[n:] == -7.0).all()  # exact: rows past the slice are left as they were
