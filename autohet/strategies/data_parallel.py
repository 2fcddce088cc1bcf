"""The data-parallel family (seed 000): whole model copies on every executor, work split by a rule.

Each scheduler is a few lines deciding sizes; the shared event loop is in ``_driver``. W is the
number of images, v_i an executor's speed measured on its latest unit (images/s).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.errors import UserError
from autohet.params import Param
from autohet.strategies._driver import SchedState, drive, split_by_weights
from autohet.strategies.base import Strategy

if TYPE_CHECKING:
    from autohet.measurement import Measurement
    from autohet.pool import Pool
    from autohet.run import RunContext

__all__ = ["ChunkScheduler", "DataParallelStrategy", "FastSplitScheduler", "FifoScheduler", "HatScheduler",
           "QuickScheduler", "SingleScheduler", "StaticScheduler"]

Plan = list[tuple[int, int]]

# Opt-in variant of the seed's fixed sizes (probe, chunk): counted in images, as the seed says, or in
# batches of the executor that runs them (a GPU ~1000x faster than a CPU group then gets its own size).
UNIT = Param("unit", "choice", "images", choices=("images", "batches"),
             help="fixed sizes count images (the seed's rule) or batches of each executor")


class DataParallelStrategy(Strategy):
    """Base of the family: ``assign`` sizes work for idle executors; ``barrier`` waits for all."""

    family: ClassVar[str] = "data_parallel"
    barrier: ClassVar[bool] = False

    def begin(self, state: SchedState, params: dict[str, Any]) -> None:  # noqa: B027
        """Optional hook: per-run state goes into ``state.memo`` (strategies stay stateless)."""

    @abstractmethod
    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        """(executor, images) pairs for some of the idle executors; sizes are capped by the driver."""

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        self.check_pool(pool, params)
        result = drive(self, params, pool.dispatcher(), ctx.workload.images, ctx.on_event,
                       [e.batch for e in pool.spec.executors], ctx.deadline_s, ctx.lookahead)
        # the limit is measured right after the run, when nothing else competes for the devices
        # (at a trial's start the previous trial's process and its logging may still be running)
        standalone = ctx.standalone(pool)
        return ctx.measurement(pool, self.name, params, result, standalone)


class SingleScheduler(DataParallelStrategy):
    """All images on one executor: the single-device baseline (also batch-1 latency's baseline)."""

    name = "single"
    barrier = True
    params = {"executor": Param("executor", "int", 0, 0, 1023, help="index of the executor in the pool")}

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        if params["executor"] >= len(pool):
            raise UserError(f"single: executor {params['executor']} is out of range; the pool has "
                            f"{len(pool)} executors (0-{len(pool) - 1}: {', '.join(pool.names)})")

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        if ctx.objective != "latency":
            return super().run(pool, ctx, params)
        from autohet.latency import latency_on_executor

        self.check_pool(pool, params)
        return latency_on_executor(pool, ctx, params["executor"], self.name, params)

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        target = params["executor"] if params["executor"] in idle else idle[0]
        return [(target, state.remaining)]


class StaticScheduler(DataParallelStrategy):
    """Fixed shares w_i = W * r_i / sum(r), equal shares when no ratios are given."""

    name = "static"
    barrier = True
    params = {"ratios": Param("ratios", "float_list", None, 0.0, None, help="one weight per executor")}

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        ratios = params["ratios"]
        if ratios is not None and (len(ratios) != len(pool) or sum(ratios) <= 0):
            raise UserError(f"static: ratios needs {len(pool)} non-negative weights, one per executor "
                            f"({', '.join(pool.names)}), not all zero; got {ratios}")

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        ratios = params["ratios"] or [1.0] * state.n
        shares = split_by_weights(state.remaining, [ratios[i] for i in idle])
        return list(zip(idle, shares, strict=True))


class QuickScheduler(DataParallelStrategy):
    """A probe of p images on every executor, then the rest split once by the probe's speeds."""

    name = "quick"
    barrier = True
    params = {"p": Param("p", "int", 64, 1, 100000, help="probe size per executor"), "unit": UNIT}

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        if state.round_index == 1:
            return [(i, state.fixed_size(i, params["p"], params["unit"])) for i in idle]
        shares = split_by_weights(state.remaining, state.speed_weights(idle))
        return list(zip(idle, shares, strict=True))


class ChunkScheduler(DataParallelStrategy):
    """Rounds of w images: the first split equally, round k+1 by round k's speeds; barrier per round."""

    name = "chunk"
    barrier = True
    params = {"w": Param("w", "int", 512, 1, 1000000, help="images per round")}

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        total = min(params["w"], state.remaining)
        weights = [1.0] * len(idle) if state.round_index == 1 else state.speed_weights(idle)
        return list(zip(idle, split_by_weights(total, weights), strict=True))


class HatScheduler(DataParallelStrategy):
    """Like chunk, but all the rest goes at once when finish times were close or little is left;
    otherwise the chunk doubles each round."""

    name = "hat"
    barrier = True
    params = {
        "s": Param("s", "int", 128, 1, 1000000, help="initial chunk (images in round 1)"),
        "tol": Param("tol", "float", 0.1, 0.0, 1.0, help="finish times are close when (max-min)/max <= tol"),
    }

    def begin(self, state: SchedState, params: dict[str, Any]) -> None:
        state.memo["chunk"] = params["s"]

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        if state.round_index == 1:
            total = min(params["s"], state.remaining)
            return list(zip(idle, split_by_weights(total, [1.0] * len(idle)), strict=True))
        times = list(state.last_round_finish.values())
        close = bool(times) and max(times) > 0 and (max(times) - min(times)) / max(times) <= params["tol"]
        little_left = state.remaining <= 2 * state.memo["chunk"]
        if close or little_left:
            total = state.remaining
            state.memo["final"] = True
        else:
            state.memo["chunk"] *= 2
            total = min(state.memo["chunk"], state.remaining)
        return list(zip(idle, split_by_weights(total, state.speed_weights(idle)), strict=True))


class FifoScheduler(DataParallelStrategy):
    """Fixed chunks of c images to whichever executor is idle; no barrier."""

    name = "fifo"
    params = {"c": Param("c", "int", 128, 1, 1000000, help="chunk size"), "unit": UNIT}

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        return [(i, state.fixed_size(i, params["c"], params["unit"])) for i in idle]


class FastSplitScheduler(DataParallelStrategy):
    """Probe chunks of w_s until every executor finished one; then w_i = remaining * r * v_i / max(v);
    all of the rest once fewer than ``threshold`` images remain."""

    name = "fast_split"
    params = {
        "w_s": Param("w_s", "int", 64, 1, 1000000, help="probe chunk"),
        "r": Param("r", "float", 0.5, 0.01, 1.0, help="fraction of the remaining work for the fastest"),
        "threshold": Param("threshold", "int", 100, 1, 1000000, help="below it, the rest goes at once"),
        "unit": UNIT,
    }

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        probing = any(alive and done == 0 for alive, done in zip(state.alive, state.completed_units,
                                                                 strict=True))
        remaining = state.remaining
        plan: Plan = []
        fastest = max((s for s, a in zip(state.speeds, state.alive, strict=True) if a and s), default=0.0)
        for i in idle:
            if remaining <= 0:
                break
            if probing or not state.speeds[i] or fastest <= 0:
                size = min(state.fixed_size(i, params["w_s"], params["unit"]), remaining)
            elif remaining < params["threshold"]:
                size = remaining
            else:
                size = max(1, int(remaining * params["r"] * state.speeds[i] / fastest))
            plan.append((i, size))
            remaining -= size
        return plan
