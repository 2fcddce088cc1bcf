"""GPU 0's clock and power while a block of a bench runs: a stream slower than its run because the GPU
itself ran slower (its clock held down for power or heat) shows here, not in autohet's figures."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["GpuClock"]


class GpuClock:
    """GPU 0's SM clock (MHz) and power (W) sampled every 5 ms on a thread while the block runs, and the
    clock-throttle reasons NVML reported (``nvmlDeviceGetCurrentClocksThrottleReasons``'s bits, ORed).
    Where NVML does not answer (no GPU, no pynvml), ``figures`` is empty and ``summary`` says why."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, int]] = []
        self.reason = ""
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None

    def _sample(self, nv: Any, handle: Any) -> None:
        while not self._done.wait(0.005):
            self.samples.append((nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                                 nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))

    def __enter__(self) -> GpuClock:
        from autohet.platform.sensors import nvml_module

        try:
            nv = nvml_module()
            handle = nv.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # noqa: BLE001 - no NVML here: the bench goes on without clocks
            self.reason = str(exc)
        else:
            self._sampler = threading.Thread(target=self._sample, args=(nv, handle), daemon=True, name="gpu-clock")
            self._sampler.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._sampler:
            self._sampler.join()

    @property
    def figures(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        clocks, watts, reasons = zip(*self.samples, strict=True)
        ored = 0
        for bits in reasons:
            ored |= bits
        return {"sm_mhz_mean": sum(clocks) / len(clocks), "sm_mhz_min": min(clocks),
                "watts_mean": sum(watts) / len(watts), "watts_max": max(watts), "throttle_bits": ored,
                "samples": len(clocks)}

    def summary(self) -> str:
        f = self.figures
        if not f:
            return f"GPU clock not read ({self.reason or 'no samples'})"
        return (f"GPU 0 SM {f['sm_mhz_mean']:.0f} MHz mean, {f['sm_mhz_min']} min; {f['watts_mean']:.0f} W mean, "
                f"{f['watts_max']:.0f} max; throttle bits {f['throttle_bits']:#x} ({f['samples']} samples)")
