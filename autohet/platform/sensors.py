"""Energy, power, temperature and clocks of this machine's devices: the sources a run can read.

What a machine exposes differs: NVIDIA GPUs through NVML (``pynvml``, from nvidia-ml-py: the
total-energy counter, power, temperature, SM clock), CPU packages through RAPL
(``/sys/class/powercap/intel-rapl*/energy_uj``, often root-only or absent in containers), other
sensors through ``psutil.sensors_temperatures()`` (empty in many containers). A figure that cannot
be read is recorded as unavailable with its reason, never as 0: a 0 would win an energy tune. The
meter that reads them around a run is ``autohet.platform.meter``; what a temperature means for a run
(a bound, cooling between trials) is ``autohet.platform.thermal``. pynvml and psutil are imported only
when first used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RAPL_ROOT", "THERMAL_ROOT", "EnergyCounter", "Gauge", "Sources", "default_sources", "failure_reason",
           "nvml_module", "nvml_sources", "psutil_temperatures", "rapl_counters", "read_temperatures",
           "sysfs_temperatures"]

RAPL_ROOT = Path("/sys/class/powercap")
THERMAL_ROOT = Path("/sys/class/thermal")


@dataclass
class EnergyCounter:
    """A cumulative energy counter read in joules. ``wrap_j``: its range, so a reading below the
    previous one is a wraparound (RAPL's ``max_energy_range_uj``); None: it never wraps (NVML)."""

    name: str
    read: Callable[[], float]
    wrap_j: float | None = None

    def delta(self, before: float, after: float) -> float:
        if after >= before:
            return after - before
        if self.wrap_j:
            return after + self.wrap_j - before
        raise ValueError(f"{self.name}: counter went backwards ({before:.6g} -> {after:.6g} J) and has no known range")


@dataclass
class Gauge:
    """Instantaneous figures of one kind (``temp_c``, ``power_w``, ``sm_mhz``) by device name."""

    kind: str
    read: Callable[[], dict[str, float]]


@dataclass
class Sources:
    """What can be read on this machine, and for each figure that cannot, why."""

    counters: list[EnergyCounter] = field(default_factory=list)
    gauges: list[Gauge] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    def __add__(self, other: Sources) -> Sources:
        return Sources(self.counters + other.counters, self.gauges + other.gauges,
                       {**self.unavailable, **other.unavailable})


# ---------------------------------------------------------------- readers


def rapl_counters(root: Path | str = RAPL_ROOT) -> Sources:
    """CPU package energy counters (top-level RAPL zones ``intel-rapl:N``; their sub-zones are
    parts of the package). Each unreadable zone is unavailable with the error."""
    root = Path(root)
    if not root.is_dir():
        return Sources(unavailable={"energy_cpu": f"no {root} (RAPL not exposed here: a container, a VM, "
                                                  "or a CPU without the powercap driver)"})
    zones = sorted((p for p in root.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name)),
                   key=lambda p: int(p.name.split(":")[1]))
    if not zones:
        return Sources(unavailable={"energy_cpu": f"no RAPL package zone (intel-rapl:N) under {root}"})
    out = Sources()
    for zone in zones:
        label = _text(zone / "name") or f"package-{zone.name.split(':')[1]}"
        name = "cpu_" + _clean(label.replace("package-", "pkg"))
        energy = zone / "energy_uj"
        try:
            int(energy.read_text().strip())
        except (OSError, ValueError) as exc:
            out.unavailable[f"energy_{name}"] = f"{energy} not readable ({failure_reason(exc)})"
            continue
        wrap = _text(zone / "max_energy_range_uj")
        out.counters.append(EnergyCounter(name, lambda f=energy: int(f.read_text().strip()) / 1e6,
                                          int(wrap) / 1e6 if wrap and wrap.isdigit() else None))
    return out


_NVML: dict[str, Any] = {}


def nvml_module() -> Any:
    """pynvml, initialised once per process; raises RuntimeError with the reason it cannot be."""
    if "module" not in _NVML:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML["module"] = pynvml
        except ImportError:
            _NVML["module"] = None
            _NVML["reason"] = "pynvml not installed (pip install nvidia-ml-py)"
        except Exception as exc:  # no driver, no GPU: NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _NVML["module"] = None
            _NVML["reason"] = f"NVML did not start ({failure_reason(exc)})"
    if _NVML["module"] is None:
        raise RuntimeError(_NVML["reason"])
    return _NVML["module"]


def nvml_sources(gpus: Sequence[int], nvml: Any = None) -> Sources:
    """Energy counters and power/temperature/SM-clock gauges of the GPUs with these CUDA indices.

    A CUDA index maps to an NVML device through CUDA_VISIBLE_DEVICES when it lists devices (by
    index or UUID), else index for index (NVML counts in PCI order: set CUDA_DEVICE_ORDER=PCI_BUS_ID
    where GPUs of different speeds would be ordered differently by CUDA).
    """
    if not gpus:
        return Sources()
    try:
        nv = nvml if nvml is not None else nvml_module()
    except RuntimeError as exc:
        return Sources(unavailable={"energy_gpu": str(exc), "temp_gpu": str(exc)})
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    out, handles = Sources(), {}
    for index in sorted(set(gpus)):
        name = f"gpu{index}"
        target = visible[index] if index < len(visible) else str(index)
        try:
            handle = (nv.nvmlDeviceGetHandleByUUID(target) if not target.isdigit()
                      else nv.nvmlDeviceGetHandleByIndex(int(target)))
        except Exception as exc:
            out.unavailable[f"energy_{name}"] = f"no NVML device {target} ({failure_reason(exc)})"
            continue
        handles[name] = handle
        try:
            nv.nvmlDeviceGetTotalEnergyConsumption(handle)
            out.counters.append(EnergyCounter(
                name, lambda h=handle: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3))  # mJ
        except Exception as exc:  # NotSupported before Volta
            out.unavailable[f"energy_{name}"] = f"NVML total-energy counter not readable ({failure_reason(exc)})"
    reads = {"power_w": lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1e3,  # mW
             "temp_c": lambda h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
             "sm_mhz": lambda h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))}
    for kind, read in reads.items():
        ok = {}
        for name, handle in handles.items():
            try:
                read(handle)
                ok[name] = handle
            except Exception as exc:
                figure = {"power_w": "power", "temp_c": "temp", "sm_mhz": "clock"}[kind]
                out.unavailable[f"{figure}_{name}"] = f"NVML {kind} not readable ({failure_reason(exc)})"
        if ok:
            out.gauges.append(Gauge(kind, lambda r=read, ok=ok: {n: r(h) for n, h in ok.items()}))
    return out


def psutil_temperatures(read: Callable[[], dict[str, list[Any]]] | None = None) -> Sources:
    """The host's temperature sensors, one figure per chip (its hottest entry: coretemp, k10temp,
    nvme, ...)."""
    if read is None:
        try:
            import psutil
        except ImportError:
            return Sources(unavailable={"temp_host": "psutil not installed"})
        read = getattr(psutil, "sensors_temperatures", None)
        if read is None:
            return Sources(unavailable={"temp_host": "psutil has no temperature sensors on this platform"})
    try:
        first = read()
    except Exception as exc:
        return Sources(unavailable={"temp_host": f"psutil.sensors_temperatures() failed ({failure_reason(exc)})"})
    if not any(first.values()):
        return Sources(unavailable={"temp_host": "psutil.sensors_temperatures() is empty (no hwmon or thermal "
                                                 "sensor visible here, as in most containers)"})

    def chips() -> dict[str, float]:
        return {_clean(chip): max(float(e.current) for e in entries) for chip, entries in read().items() if entries}

    return Sources(gauges=[Gauge("temp_c", chips)])


def sysfs_temperatures(root: Path | str = THERMAL_ROOT) -> Sources:
    """The kernel's thermal zones (``thermal_zone*/temp``, millidegrees), one figure per zone type:
    where psutil sees no chip, a VM or board may still expose these."""
    root = Path(root)
    zones = sorted(root.glob("thermal_zone*")) if root.is_dir() else []
    named = [(z, _text(z / "type") or z.name) for z in zones if _text(z / "temp") is not None]
    if not named:
        return Sources(unavailable={"temp_zones": f"{root} has no readable thermal zone"})

    def read() -> dict[str, float]:
        out: dict[str, float] = {}
        for zone, kind in named:
            text = _text(zone / "temp")
            if text is not None:
                out[_clean(kind)] = max(out.get(_clean(kind), float("-inf")), float(text) / 1000.0)
        return out

    return Sources(gauges=[Gauge("temp_c", read)])


_DEFAULT: dict[tuple[int, ...], Sources] = {}


def default_sources(gpus: Sequence[int] = ()) -> Sources:
    """RAPL, NVML for ``gpus`` and the host's temperature sensors (psutil, else the kernel's thermal
    zones), probed once per process and GPU set."""
    key = tuple(sorted(set(gpus)))
    if key not in _DEFAULT:
        host = psutil_temperatures()
        if not host.gauges:
            zones = sysfs_temperatures()
            host = zones if zones.gauges else host + zones
        _DEFAULT[key] = rapl_counters() + nvml_sources(key) + host
    return _DEFAULT[key]


def read_temperatures(sources: Sources) -> tuple[dict[str, float], dict[str, str]]:
    """Every temperature readable now (°C by device) and, for each that failed, why."""
    out: dict[str, float] = {}
    failed: dict[str, str] = {}
    for gauge in sources.gauges:
        if gauge.kind != "temp_c":
            continue
        try:
            out.update(gauge.read())
        except Exception as exc:
            failed[f"temp_{gauge.kind}"] = failure_reason(exc)
    return out, failed


# ---------------------------------------------------------------- helpers


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


def _clean(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "sensor"


def failure_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, PermissionError):
        return "permission denied: RAPL is root-only on current kernels" if "energy_uj" in text else \
            f"permission denied: {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
