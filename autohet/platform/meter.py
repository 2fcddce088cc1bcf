"""The energy of a run: ``EnergyMeter`` reads the sources' counters at the start and end of a run and
samples them (and the temperatures and clocks) on a light thread in between. The samples let the run's
timed part be charged with the energy of its own length rather than of everything the strategy did
around it (warm-up, a placement search): see ``EnergyMeter.result``."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from autohet.core.settings import MIN_ENERGY_SPAN_S
from autohet.platform.sensors import Sources, failure_reason

__all__ = ["MIN_ENERGY_SPAN_S", "EnergyMeter", "EnergyResult"]


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
                self.unavailable[f"energy_{counter.name}"] = f"failed during the run ({failure_reason(exc)})"
                self.counters.remove(counter)
                self._cum.pop(counter.name, None)

    def _read_gauges(self, phase: str) -> None:
        units = {"temp_c": ("temp", "c"), "power_w": ("power", "w"), "sm_mhz": ("clock", "sm_mhz")}
        for gauge in self.sources.gauges:
            prefix, unit = units.get(gauge.kind, (gauge.kind, ""))
            try:
                values = gauge.read()
            except Exception as exc:
                self.unavailable.setdefault(prefix, f"{gauge.kind} not readable ({failure_reason(exc)})")
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


