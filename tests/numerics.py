"""The tolerances tests compare floats with, derived from the computation instead of picked.

Two fp32 runs of one model that take different kernels (oneDNN's AVX-512, AMX or AVX2 blocking, the
reference path under ``ATEN_CPU_CAPABILITY=default``, one thread or two) sum each output's products
in other orders. A sum of n products rounded in any order is off by at most about n * eps of the sum
of their magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); the tests bound the
difference of two fp32 runs by eps x the model's longest reduction x max |reference|. Across precisions,
or where a compiler reorders whole layers, the product's own output-check tolerance applies
(``autohet.context.TOLERANCE``). A comparison stays exact (``== 0``, ``array_equal``) only where both
sides run the same kernels on the same number of threads, or move bytes without arithmetic; such a
line says ``exact:`` and why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autohet.context import TOLERANCE

__all__ = ["FP32_EPS", "assert_fp32_close", "assert_run_fp32_close", "assert_within_product_tolerance", "fp32_bound",
           "longest_reduction", "product_bound"]

FP32_EPS = float(np.finfo(np.float32).eps)


def longest_reduction(model: Any) -> int:
    """The most products any one output of ``model``'s convolutions and linear layers sums
    (in_channels / groups x kernel area, or in_features)."""
    import torch

    longest = 1
    for module in model.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            longest = max(longest, module.in_channels // module.groups * int(np.prod(module.kernel_size)))
        elif isinstance(module, torch.nn.Linear):
            longest = max(longest, module.in_features)
    return longest


def _max_abs(ref: Any) -> float:
    values = ref.detach().float().cpu().numpy() if hasattr(ref, "detach") else np.asarray(ref, dtype=np.float64)
    return max(float(np.max(np.abs(values))), 1e-30)


def fp32_bound(ref: Any, reduction: int) -> float:
    """The most two fp32 runs of one computation may differ by: eps x its longest reduction x max |ref|."""
    return FP32_EPS * reduction * _max_abs(ref)


def product_bound(precision: str, ref: Any) -> float:
    """The output check's own tolerance for ``precision`` (relative to max |ref|)."""
    return TOLERANCE[precision] * _max_abs(ref)


def _diff(got: Any, want: Any) -> float:
    if hasattr(got, "detach"):
        got = got.detach().float().cpu().numpy()
    if hasattr(want, "detach"):
        want = want.detach().float().cpu().numpy()
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want))) if got.size else 0.0


def assert_fp32_close(got: Any, want: Any, model_or_reduction: Any, what: str = "") -> None:
    """``got`` within ``fp32_bound`` of ``want``; the reduction length from a model, or given."""
    reduction = model_or_reduction if isinstance(model_or_reduction, int) else longest_reduction(model_or_reduction)
    diff, bound = _diff(got, want), fp32_bound(want, reduction)
    assert diff <= bound, f"{what} max |diff| {diff:.3g} > {bound:.3g} (fp32 eps x {reduction} x max |ref|)"


def assert_within_product_tolerance(got: Any, want: Any, precision: str, what: str = "") -> None:
    """``got`` within the output check's tolerance for ``precision`` of ``want``."""
    diff, bound = _diff(got, want), product_bound(precision, want)
    assert diff <= bound, f"{what} max |diff| {diff:.3g} > {bound:.3g} ({precision}'s output-check tolerance)"


def assert_run_fp32_close(measurement: Any, model: Any) -> None:
    """A run's checked outputs (``max_abs_diff`` against the fp32 reference) within ``fp32_bound``: the
    check's tolerance is fp32's share of max |ref|, which gives max |ref| back."""
    max_ref = measurement.tolerance / TOLERANCE["fp32"]
    bound = FP32_EPS * longest_reduction(model) * max_ref
    assert measurement.output_ok and measurement.max_abs_diff <= bound, (measurement.max_abs_diff, bound,
                                                                          measurement.failures)
