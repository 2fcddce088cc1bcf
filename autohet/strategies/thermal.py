"""A bound on temperature: whether a run's recorded temperatures (``telemetry.TemperatureWatch``)
broke a strategy's ``max_temp``. Policy over the sensors' readings; the sensors live in
``autohet.telemetry``."""

from __future__ import annotations

from typing import Any

__all__ = ["temperature_violation"]


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
