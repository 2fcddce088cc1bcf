"""The tune's thermal policy: before each trial, wait (capped) for the devices to cool a margin
below ``--max-temp``; after it, a trial whose hottest reading passed ``--max-temp`` is a violation.
The sensors it reads live in ``autohet.telemetry``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from autohet.telemetry import Sources, read_temperatures

__all__ = ["CoolWait", "too_hot", "wait_cool"]


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
