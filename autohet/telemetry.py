"""Energy, power, temperature and clocks of this machine's devices, read around a run.

What a machine exposes differs: NVIDIA GPUs through NVML (``pynvml``, from nvidia-ml-py: the
total-energy counter, power, temperature, SM clock), CPU packages through RAPL
(``/sys/class/powercap/intel-rapl*/energy_uj``, often root-only or absent in containers), other
sensors through ``psutil.sensors_temperatures()`` (empty in many containers). A figure that cannot
be read is recorded as unavailable with its reason, never as 0: a 0 would win an energy tune.

``EnergyMeter`` reads the counters at the start and end of a run and samples them (and the
temperatures and clocks) on a light thread in between. The samples let the run's timed part be
charged with the energy of its own length rather than of everything the strategy did around it
(warm-up, a placement search): see ``EnergyMeter.result``. ``TemperatureWatch`` records every
readable temperature over a run. What to do with the readings (a bound, cooling between trials)
is policy and lives above: ``autohet.strategies.thermal``, ``autohet.tuning.thermal``. Base layer:
nothing of autohet is imported here, and pynvml and psutil only when first used.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RAPL_ROOT", "THERMAL_ROOT", "EnergyCounter", "EnergyMeter", "EnergyResult", "Gauge", "Sources",
           "TemperatureWatch", "default_sources", "nvml_module", "nvml_sources", "psutil_temperatures",
           "rapl_counters", "read_temperatures", "sysfs_temperatures"]

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
            out.unavailable[f"energy_{name}"] = f"{energy} not readable ({_reason(exc)})"
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
            _NVML["reason"] = f"NVML did not start ({_reason(exc)})"
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
            out.unavailable[f"energy_{name}"] = f"no NVML device {target} ({_reason(exc)})"
            continue
        handles[name] = handle
        try:
            nv.nvmlDeviceGetTotalEnergyConsumption(handle)
            out.counters.append(EnergyCounter(
                name, lambda h=handle: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3))  # mJ
        except Exception as exc:  # NotSupported before Volta
            out.unavailable[f"energy_{name}"] = f"NVML total-energy counter not readable ({_reason(exc)})"
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
                out.unavailable[f"{figure}_{name}"] = f"NVML {kind} not readable ({_reason(exc)})"
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
        return Sources(unavailable={"temp_host": f"psutil.sensors_temperatures() failed ({_reason(exc)})"})
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
            failed[f"temp_{gauge.kind}"] = _reason(exc)
    return out, failed


# ---------------------------------------------------------------- the meter


@dataclass
class EnergyResult:
    """What a meter read. ``run_j``: the energy charged to the run's timed seconds (``run_s``);
    ``window_*``: everything between start and stop, excluded stretches cut out."""

    window_s: float
    window_j: dict[str, float]
    run_s: float
    run_j: dict[str, float]
    images: int
    gauges: dict[str, float]
    temp_max_c: float | None
    samples: int
    unavailable: dict[str, str]

    @property
    def energy_j(self) -> float | None:
        return sum(self.run_j.values()) if self.run_j else None

    def metrics(self) -> dict[str, float]:
        """Flat numeric figures (trial metrics); what could not be read is absent, never 0."""
        out: dict[str, float] = {}
        total = self.energy_j
        if total is not None:
            out["energy_j"] = total
            if self.images > 0:
                out["energy_j_per_image"] = total / self.images
            if self.run_s > 0:
                out["power_avg_w"] = total / self.run_s
            out.update({f"energy_{name}_j": j for name, j in self.run_j.items()})
            out["energy_window_j"] = sum(self.window_j.values())
            out["energy_window_s"] = self.window_s
            out["energy_samples"] = float(self.samples)
        if self.temp_max_c is not None:
            out["temp_max_c"] = self.temp_max_c
        out.update(self.gauges)
        return out


MIN_ENERGY_SPAN_S = 1.0  # the shortest stretch of a trace whose energy is read as the run's (see result)


class EnergyMeter:
    """Counters read at start and stop, sampled every ``interval_s`` in between (None: no thread;
    ``sample()`` may be called by hand, as tests do with a fake ``clock``). A context manager.

    ``excluded()`` cuts a stretch out of the run (its energy and seconds): the standalone-speed
    measurements a strategy asks for are not the run's.
    """

    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic,
                 interval_s: float | None = 0.1) -> None:
        self.sources, self.clock, self.interval_s = sources, clock, interval_s
        self.unavailable = dict(sources.unavailable)
        self.counters = list(sources.counters)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._raw: dict[str, float] = {}
        self._cum: dict[str, float] = {}
        self._trace: list[tuple[float, dict[str, float]]] = []
        self._paused = 0
        self._pause_at: tuple[float, dict[str, float]] | None = None
        self._cut_s = 0.0
        self._cut_j: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._temp_max: float | None = None
        self._running = False

    # -- reading
    def _read_counters(self) -> None:
        for counter in list(self.counters):
            try:
                raw = float(counter.read())
                if counter.name in self._raw:
                    self._cum[counter.name] += counter.delta(self._raw[counter.name], raw)
                else:
                    self._cum[counter.name] = 0.0
                self._raw[counter.name] = raw
            except Exception as exc:  # a counter that fails mid-run is dropped: its total would be wrong
                self.unavailable[f"energy_{counter.name}"] = f"failed during the run ({_reason(exc)})"
                self.counters.remove(counter)
                self._cum.pop(counter.name, None)

    def _read_gauges(self, phase: str) -> None:
        units = {"temp_c": ("temp", "c"), "power_w": ("power", "w"), "sm_mhz": ("clock", "sm_mhz")}
        for gauge in self.sources.gauges:
            prefix, unit = units.get(gauge.kind, (gauge.kind, ""))
            try:
                values = gauge.read()
            except Exception as exc:
                self.unavailable.setdefault(prefix, f"{gauge.kind} not readable ({_reason(exc)})")
                continue
            for device, value in values.items():
                base = f"{prefix}_{device}"
                if phase in ("before", "after"):
                    self._gauges[f"{base}_{phase}_{unit}"] = value
                hi, lo = f"{base}_max_{unit}", f"{base}_min_{unit}"
                self._gauges[hi] = max(value, self._gauges.get(hi, value))
                if gauge.kind == "sm_mhz":  # a clock that drops during the run: throttling
                    self._gauges[lo] = min(value, self._gauges.get(lo, value))
                if gauge.kind == "temp_c":
                    self._temp_max = value if self._temp_max is None else max(self._temp_max, value)

    def _point(self) -> None:
        """One trace point in the run's own time (excluded stretches cut out)."""
        t = self.clock() - self._cut_s
        self._trace.append((t, {n: c - self._cut_j.get(n, 0.0) for n, c in self._cum.items()}))

    def sample(self) -> None:
        """One reading of every counter and gauge (the thread calls this every interval)."""
        with self._lock:
            if not self._running:
                return
            self._read_counters()
            self._read_gauges("during")
            if not self._paused:
                self._point()

    # -- the run's span
    def start(self) -> EnergyMeter:
        with self._lock:
            self._running = True
            self._read_counters()
            self._read_gauges("before")
            self._point()
        if self.interval_s and (self.counters or self.sources.gauges):
            self._thread = threading.Thread(target=self._loop, name="autohet-energy", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if not self._running:
                return
            self._read_counters()
            self._read_gauges("after")
            self._point()
            self._running = False

    def __enter__(self) -> EnergyMeter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """A stretch that is not the run's: its seconds and joules are cut out (nesting is fine)."""
        with self._lock:
            self._paused += 1
            if self._paused == 1 and self._running:
                self._read_counters()
                self._point()
                self._pause_at = (self.clock(), dict(self._cum))
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                if self._paused == 0 and self._running and self._pause_at is not None:
                    self._read_counters()
                    t0, cum0 = self._pause_at
                    self._cut_s += self.clock() - t0
                    for name, c in self._cum.items():
                        self._cut_j[name] = self._cut_j.get(name, 0.0) + c - cum0.get(name, c)
                    self._pause_at = None
                    self._point()

    def result(self, images: int, run_s: float | None = None) -> EnergyResult:
        """The figures of the span. The run's energy is that of its busiest ``run_s`` seconds in
        the sampled trace (a strategy's timed part is where its devices work hardest: warm-up and
        searches run the same work, so this equals the timed part's energy for steady work and
        never undercharges it); without samples between start and stop that is the window's
        average power times ``run_s``. ``run_s`` None or longer than the window: the whole window."""
        with self._lock:
            trace = [(t, {n: c.get(n, 0.0) for n in self._cum}) for t, c in self._trace]
            names = list(self._cum)
            gauges = dict(self._gauges)
            temp_max = self._temp_max
            unavailable = dict(self.unavailable)
        if not names:
            unavailable.setdefault("energy_j", "no energy counter readable (see the energy_* reasons)")
        if temp_max is None and not any(k.startswith("temp") for k in unavailable):
            unavailable["temp"] = "no temperature sensor readable"
        window_s = trace[-1][0] - trace[0][0] if len(trace) > 1 else 0.0
        window_j = {n: trace[-1][1][n] - trace[0][1][n] for n in names} if len(trace) > 1 else {}
        span = window_s if run_s is None or run_s <= 0 or run_s >= window_s else run_s
        run_j = dict(window_j)
        if names and window_s > 0:
            # counters move in steps (NVML's every few tens of ms): a stretch much shorter than a
            # second can hold a whole step and read twice the power; such runs are charged the
            # average power of the busiest second around them
            measured = min(window_s, max(span, MIN_ENERGY_SPAN_S))
            run_j = {n: j * span / measured for n, j in _busiest(trace, names, measured).items()}
        return EnergyResult(window_s, window_j, span, run_j, images, gauges, temp_max, max(0, len(trace) - 2),
                            unavailable)


def _busiest(trace: list[tuple[float, dict[str, float]]], names: list[str], span: float) -> dict[str, float]:
    """Per counter, the energy in the ``span``-second stretch of the trace with the most energy in
    total (cumulative counters interpolated linearly between samples)."""
    times = [t for t, _ in trace]
    totals = [sum(c[n] for n in names) for _, c in trace]
    t0, t1 = times[0], times[-1]

    def at(values: list[float], t: float) -> float:
        i = min(max(bisect.bisect_right(times, t) - 1, 0), len(times) - 2)
        dt = times[i + 1] - times[i]
        frac = 0.0 if dt <= 0 else (t - times[i]) / dt
        return values[i] + (values[i + 1] - values[i]) * frac

    # a piecewise-linear difference peaks where one end of the stretch sits on a sample
    starts = {min(max(t, t0), t1 - span) for t in times} | {min(max(t - span, t0), t1 - span) for t in times}
    best = max(sorted(starts), key=lambda s: at(totals, s + span) - at(totals, s))
    out = {}
    for n in names:
        values = [c[n] for _, c in trace]
        out[n] = at(values, best + span) - at(values, best)
    return out


# ---------------------------------------------------------------- temperatures over a run


class TemperatureWatch:
    """Every readable temperature before, during (a light thread every ``interval_s``) and after a
    run; ``report()`` gives per device before/after/max °C, and for what cannot be read, why."""

    def __init__(self, sources: Sources, interval_s: float = 0.5) -> None:
        self.sources, self.interval_s = sources, interval_s
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.peak: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, into: dict[str, float] | None = None) -> None:
        temps, failed = read_temperatures(self.sources)
        self.failed.update(failed)
        for name, value in temps.items():
            self.peak[name] = max(self.peak.get(name, value), value)
            if into is not None:
                into[name] = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> TemperatureWatch:
        self._read(self.before)
        if self.before:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="autohet-temperature")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._read(self.after)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: {"before_c": self.before.get(name), "after_c": self.after.get(name),
                                      "max_c": value} for name, value in self.peak.items()}
        reasons = {k: v for k, v in {**self.sources.unavailable, **self.failed}.items() if k.startswith("temp")}
        if not out:
            out["unavailable"] = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no temperature sensor"
        return out


# ---------------------------------------------------------------- helpers


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


def _clean(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "sensor"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, PermissionError):
        return "permission denied: RAPL is root-only on current kernels" if "energy_uj" in text else \
            f"permission denied: {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
