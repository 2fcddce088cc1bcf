"""What a GPU lane's pixel scaling costs on the device, by how it is written: uint8 pixels landed in NCHW,
scaled per channel (``x * a + b``) into the model's fp16 channels_last input, one batch at a time.

Over two H200s the uint8 pixels stream ran at 0.93x its run where page-locked float32, converted on the GPU
the same way but without the scale, ran at 0.98x; the pixel lanes spent about 1.5% more device time an
image (BENCHMARKS.md 44). The executor then scaled with ``addcmul``; it now runs ``scale_pixels``'s
Triton kernel (``addcmul`` stays its fallback where Triton is missing).
This times each way of writing the scale with CUDA events, its outputs against the float32 reference:

    python -m bench.pixel_scale --batch 256
"""

from __future__ import annotations

import argparse

import torch

from autohet.executors.pixel_kernel import scale_pixels


def variants(a32: torch.Tensor, b32: torch.Tensor) -> dict:
    a16, b16 = a32.half(), b32.half()

    def triton_planes(u8: torch.Tensor, out: torch.Tensor) -> None:  # the executor's way
        scale_pixels(u8, a32, b32, out)

    def addcmul_fp32_factors(u8: torch.Tensor, out: torch.Tensor) -> None:  # the executor's fallback
        torch.addcmul(b32, u8, a32, out=out)

    def addcmul_fp16_factors(u8: torch.Tensor, out: torch.Tensor) -> None:
        torch.addcmul(b16, u8, a16, out=out)

    def scale_nchw_then_layout(u8: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(torch.addcmul(b16, u8, a16))

    def layout_then_scale(u8: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(u8)
        out.mul_(a16).add_(b16)

    tiles: dict = {}

    def layout_then_tiled_scale(u8: torch.Tensor, out: torch.Tensor) -> None:
        """The cast and layout in one copy (all of uint8's conversion a copy does), then the scale in place on a
        flat view whose rows hold 64 whole pixels, its factors tiled to match: every operand fp16, the inner
        dimension 192 contiguous elements (a broadcast over the channels alone is 3)."""
        out.copy_(u8)
        flat = out.permute(0, 2, 3, 1).reshape(-1, 192)  # channels_last memory: pixel after pixel, C within
        if "a" not in tiles:
            tiles["a"], tiles["b"] = a16.reshape(1, 3).repeat(1, 64), b16.reshape(1, 3).repeat(1, 64)
        torch.addcmul(tiles["b"], flat, tiles["a"], out=flat)

    def uint8_copy(u8: torch.Tensor, out: torch.Tensor) -> None:  # the cast and layout alone: the floor
        out.copy_(u8)

    def float32_copy(f32: torch.Tensor, out: torch.Tensor) -> None:  # page-locked float32's conversion
        out.copy_(f32)

    compiled: dict = {}

    def inductor(u8: torch.Tensor, out: torch.Tensor) -> None:
        """torch.compile's own fusion of the scale, cast and layout (its output copied into ``out``)."""
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(
                lambda p: (p * a32 + b32).to(out.dtype).contiguous(memory_format=torch.channels_last))
        out.copy_(compiled["fn"](u8))

    return {"Triton planes, scale_pixels (the executor's)": triton_planes,
            "inductor's fused kernel, copied out": inductor,
            "addcmul, fp32 factors (the fallback)": addcmul_fp32_factors,
            "addcmul, fp16 factors": addcmul_fp16_factors,
            "scale in NCHW, then the layout": scale_nchw_then_layout, "layout, then scale in place": layout_then_scale,
            "layout, then scale on 64-pixel rows": layout_then_tiled_scale, "uint8 copy, no scale": uint8_copy,
            "float32 copy (page-locked float32's)": float32_copy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device).manual_seed(0)
    u8 = torch.randint(0, 256, (args.batch, 3, 224, 224), dtype=torch.uint8, device=device, generator=gen)
    f32 = u8.float()
    std, mean = torch.tensor([0.229, 0.224, 0.225]), torch.tensor([0.485, 0.456, 0.406])
    a32 = (1.0 / (255.0 * std)).reshape(1, 3, 1, 1).to(device)
    b32 = (-mean / std).reshape(1, 3, 1, 1).to(device)
    reference = (f32 * a32 + b32).contiguous(memory_format=torch.channels_last)
    out = torch.empty_like(reference, dtype=torch.float16)
    print(f"batch {args.batch}, uint8 NCHW -> fp16 channels_last, {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}")
    for name, fn in variants(a32, b32).items():
        source = f32 if "float32" in name else u8
        with torch.inference_mode():
            for _ in range(10):
                fn(source, out)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.runs):
                fn(source, out)
            end.record()
            end.synchronize()
        ms = start.elapsed_time(end) / args.runs
        expected = reference if "copy" not in name else f32.contiguous(memory_format=torch.channels_last)
        wrong = (out.float() - expected).abs().max().item()
        print(f"{name:<40} {ms * 1e3:8.1f} us a batch ({args.batch / ms * 1e3:10.0f} img/s)   max |diff| {wrong:.4f}")


if __name__ == "__main__":
    main()
