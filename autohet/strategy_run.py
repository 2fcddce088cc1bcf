"""One strategy run on a pool: validate its parameters, start the pool, run, return the Measurement.

The only module above the strategies that runs them (the CLI and the tuner call it), so it is also
where every run's energy and temperatures are read (``autohet.platform.meter``): around ``strategy.run``,
with the standalone-speed measurements the strategy asks for cut out. The figures land in
``m.extra["energy"]`` (flat numbers: ``energy_j_per_image`` is the energy objective's, joules per
request in a latency run) and ``m.extra["unavailable"]`` (figure -> why it could not be read).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode
from autohet.platform.gc_control import settle
from autohet.platform.meter import EnergyMeter, EnergyResult
from autohet.platform.sensors import Sources, default_sources
from autohet.pool.standalone import spread
from autohet.strategies import get_strategy

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.pool import Pool, PoolSpec

__all__ = ["energy_sources", "record_energy", "run_strategy"]


def energy_sources(spec: PoolSpec) -> Sources:
    """What can be read for a pool on this host: its GPUs (NVML), the CPU packages (RAPL), the
    temperature sensors. A simulated pool draws nothing; executors on other nodes are not read."""
    if spec.simulated:
        reason = "simulated pool: its executors draw no energy"
        return Sources(unavailable={"energy_j": reason, "temp": reason})
    gpus = sorted({int(e.gpu) for e in spec.executors if e.is_gpu and e.node is None and e.gpu is not None})
    sources = default_sources(gpus)
    remote = sorted({e.node for e in spec.executors if e.node is not None})
    if remote:
        sources = sources + Sources(unavailable={"energy_remote": f"executors on {', '.join(remote)} are not "
                                                                   "read: energy is read on this host only"})
    return sources


def record_energy(m: Measurement, result: EnergyResult, mode: RunMode) -> None:
    """Stores a meter's figures in the Measurement (numbers in extra['energy'], reasons in
    extra['unavailable'])."""
    figures = result.metrics()
    if mode.per_request and "energy_j_per_image" in figures:
        figures["energy_j_per_request"] = figures["energy_j_per_image"]
    m.extra["energy"] = {**(m.extra.get("energy") or {}), **figures}
    unavailable = {**result.unavailable, **(m.extra.get("unavailable") or {})}
    if unavailable:
        m.extra["unavailable"] = unavailable


def run_strategy(strategy_name: str, params: dict[str, Any], pool: Pool, ctx: RunContext,
                 meter: EnergyMeter | None = None) -> Measurement:
    """Validates params, starts the pool for the context's model/workload, runs the strategy with
    its energy measured (``meter``: a test's; default, this host's sources for the pool)."""
    strategy = get_strategy(strategy_name)
    if ctx.mode not in strategy.modes:
        raise UserError(f"strategy {strategy_name} does not serve {ctx.mode} runs (it serves "
                        f"{', '.join(strategy.modes)}); pick another --objective or strategy")
    checked = strategy.validate(strategy.defaults_for(pool.spec, params))
    strategy.check_pool(pool, checked)
    if not strategy.on_engine:
        pool.start(ctx.model, ctx.workload)
    meter = meter if meter is not None else EnergyMeter(energy_sources(pool.spec))
    measured = ctx.standalone_provider

    def standalone(p: Pool, share: int, used: list[int] | None) -> list[float]:  # not the run's energy
        with meter.excluded():
            if measured is not None:
                return measured(p, share, used)
            return spread(p.standalone_ips(ctx.standalone_seconds, share, used), used, len(p))

    settle()  # this process's collector (the driver's, and in-process executors' and engines') out of the run
    with meter:
        m = strategy.run(pool, replace(ctx, standalone_provider=standalone), checked)
    record_energy(m, meter.result(m.images, m.wall_s), ctx.mode)
    return m
