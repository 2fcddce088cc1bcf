"""Temperature: what a run recorded (``TemperatureWatch``), whether it broke a bound (``temperature_violation``
for a strategy's ``max_temp``, ``too_hot`` for the tune's ``--max-temp``), and the tune's wait for the
devices to cool a margin below that bound before each trial (``wait_cool``). The sensors are
``autohet.platform.sensors``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autohet.platform.sensors import Sources, read_temperatures

__all__ = ["CoolWait", "TemperatureWatch", "temperature_violation", "too_hot", "wait_cool"]


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



@dataclass
class CoolWait:
    """How a wait for the devices to cool ended: seconds waited, the last hottest reading, a note
    when it could not wait (no sensor) or gave up at the cap."""

    waited_s: float
    temp_c: float | None
    note: str | None = None


def wait_cool(sources: Sources, below_c: float, cap_s: float, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep, poll_s: float = 1.0) -> CoolWait:
    """Waits until the hottest readable temperature is at most ``below_c``, at most ``cap_s``."""
    start = clock()
    temps, failed = read_temperatures(sources)
    if not temps:
        reasons = {k: v for k, v in {**sources.unavailable, **failed}.items() if k.startswith("temp")}
        why = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no temperature sensor"
        return CoolWait(0.0, None, f"not waiting to cool: no temperature readable ({why})")
    hottest = max(temps.values())
    while hottest > below_c:
        if clock() - start >= cap_s:
            return CoolWait(clock() - start, hottest, f"still {hottest:.0f} C after {cap_s:.0f} s of cooling "
                                                      f"(wanted {below_c:.0f} C): ran anyway")
        sleep(poll_s)
        temps, _ = read_temperatures(sources)
        if not temps:
            break
        hottest = max(temps.values())
    return CoolWait(clock() - start, hottest)


def too_hot(hottest_c: float | None, max_temp: float | None) -> str | None:
    """Why a trial whose hottest reading was ``hottest_c`` broke ``max_temp``, or None (also when
    no bound is set or nothing was read)."""
    if max_temp is not None and hottest_c is not None and hottest_c > max_temp:
        return f"max temperature {hottest_c:.1f} C during the run is above --max-temp {max_temp:g} C"
    return None


def temperature_violation(report: dict[str, Any], max_temp: float | None) -> str | None:
    """Why a run broke ``max_temp`` (a device measured above it), or None (also when nothing was readable:
    an unchecked bound is not a violation; the report says why it could not be checked)."""
    if max_temp is None:
        return None
    hot = {name: r["max_c"] for name, r in report.items() if isinstance(r, dict) and r.get("max_c") is not None
           and r["max_c"] > max_temp}
    if not hot:
        return None
    worst = max(hot, key=lambda n: hot[n])
    return f"temperature: {worst} reached {hot[worst]:.1f} °C, above max_temp {max_temp:g} °C"
