"""The data-parallel family (seed 000): whole model copies on every executor, work split by a rule.

Each scheduler is a few lines deciding sizes; the shared event loop is in ``_driver``. W is the
number of images, v_i an executor's speed measured on its latest unit (images/s).
"""

from __future__ import annotations

from abc import abstractmethod
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from autohet.core.errors import UserError
from autohet.core.objectives import RunMode
from autohet.core.params import ChoiceParam, FloatListParam, FloatParam, IntParam
from autohet.core.workload import Workload
from autohet.strategies._driver import SchedState, drive, drive_measurement, split_by_weights
from autohet.strategies.base import Strategy
from autohet.strategies.data_parallel_served import DataParallelServed
from autohet.strategies.served import Served

if TYPE_CHECKING:
    from autohet.context import RunContext
    from autohet.core.measurement import Measurement
    from autohet.core.models import ModelSpec
    from autohet.pool import Pool, PoolSpec

__all__ = ["ChunkScheduler", "DataParallelServed", "DataParallelStrategy", "FastSplitScheduler", "FifoScheduler",
           "HatScheduler", "PoolMix", "QuickScheduler", "SingleScheduler", "StaticScheduler", "pool_suited"]

Plan = list[tuple[int, int]]

# Opt-in variant of the seed's fixed sizes (probe, chunk): counted in images, as the seed says, or in
# batches of the executor that runs them (a GPU ~1000x faster than a CPU group then gets its own size).
UNIT = ChoiceParam("unit", "images", choices=("images", "batches"),
                   help="fixed sizes count images (the seed's rule) or batches of each executor")


class PoolMix(Enum):
    """What a pool's executors are, as the schedulers' suggested defaults see it (``pool_suited``).

    ``MIXED``: GPUs beside CPU groups, devices ~100-1000x apart in speed, where the seed's fixed image
    counts (right for its Caffe/GTX machines) give a CPU group minutes of work. ``GPUS``: every executor
    a GPU (a host's several GPUs): a unit must be whole batches (an inductor executor runs a partial batch
    padded to its compiled one, so a part-filled unit costs a whole batch), and a GPU's unit should be tens
    of milliseconds so its dispatch stays small. ``CPU_GROUPS``: every executor a CPU core group, where a
    batch is up to seconds of work, so a unit of one batch costs little in dispatch and caps the tail at
    one batch, where the seed's 64-128-image units are 4-8 batches and can leave a small trial's work to
    one group alone (docs/why.md, strategies/data_parallel.py). ``OTHER``: simulated executors, one GPU
    alone: the seed's sizes."""

    MIXED = "mixed"
    GPUS = "gpus"
    CPU_GROUPS = "cpu_groups"
    OTHER = "other"

    @classmethod
    def of(cls, spec: PoolSpec) -> PoolMix:
        execs = spec.executors
        gpus = sum(1 for e in execs if e.uses_gpu)
        if gpus and gpus < len(execs):
            return cls.MIXED
        if gpus > 1 and all(e.is_gpu for e in execs):
            return cls.GPUS
        if execs and all(e.is_cpu for e in execs):
            return cls.CPU_GROUPS
        return cls.OTHER


def pool_suited(spec: PoolSpec, mixed: dict[str, Any], cpu_only: dict[str, Any],
                gpus: dict[str, Any] | None = None) -> dict[str, Any]:
    """A scheduler's suggested defaults for the pool's ``PoolMix``: ``mixed``, ``cpu_only`` or ``gpus``
    (default: ``mixed``'s, sizes in batches), else none (the seed's)."""
    return {PoolMix.MIXED: mixed, PoolMix.CPU_GROUPS: cpu_only,
            PoolMix.GPUS: mixed if gpus is None else gpus}.get(PoolMix.of(spec), {})


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
                       [e.batch for e in pool.spec.executors], ctx.deadline_s, ctx.lookahead,
                       progress=ctx.progress, hint=lambda: self.slow_hint(pool, params))
        # standalone figures: measured once per executor class (before the run by the CLI, right after
        # it by the tuner, when nothing else competes for the devices); a single's limit is its executor's
        standalone = ctx.standalone(pool, self.executors_used(params))
        return drive_measurement(ctx, pool, self.name, params, result, standalone)

    def serve(self, pool: Pool, model: ModelSpec, params: dict[str, Any], mode: RunMode, sample: Workload) -> Served:
        """The pool's executors started once (models built, compiled, warmed on ``sample``); each call's
        images become their workload and are split by this scheduler (``DataParallelServed``)."""
        pool.start(model, sample)
        return DataParallelServed(self, pool, params)

    def slow_hint(self, pool: Pool, params: dict[str, Any]) -> str:
        """What to change when a run of these params is too slow (named in the timeout error)."""
        sizes = {k: v for k, v in params.items() if k in ("p", "c", "w_s", "w", "s")}
        if params.get("unit") == "images" and PoolMix.of(pool.spec) is PoolMix.MIXED:
            return (f"a fixed size of {', '.join(f'{k}={v}' for k, v in sizes.items())} images is minutes of work "
                    "for a CPU group next to a GPU; try --set unit=batches (sizes then count each executor's "
                    "batches) or smaller sizes")
        if sizes:
            return f"try smaller {', '.join(sizes)} (now {', '.join(f'{k}={v}' for k, v in sizes.items())})"
        return "try fast_split or fifo with unit=batches, or fewer --images"


class SingleScheduler(DataParallelStrategy):
    """All images on one executor: the single-device baseline (also batch-1 latency's baseline)."""

    name = "single"
    barrier = True
    one_executor = True
    modes = (RunMode.THROUGHPUT, RunMode.LATENCY)
    params = {"executor": IntParam("executor", 0, low=0, high=1023, help="index of the executor in the pool")}

    def check_pool(self, pool: Pool, params: dict[str, Any]) -> None:
        if params["executor"] >= len(pool):
            raise UserError(f"single: executor {params['executor']} is out of range; the pool has "
                            f"{len(pool)} executors (0-{len(pool) - 1}: {', '.join(pool.names)})")

    def serve(self, pool: Pool, model: ModelSpec, params: dict[str, Any], mode: RunMode, sample: Workload) -> Served:
        """Throughput: every call on the executor (the driver's path); latency: each image a batch-1
        request on the executor's device, as the latency run measured it (``_latency``)."""
        self.check_pool(pool, params)
        if not mode.per_request:
            return super().serve(pool, model, params, mode, sample)
        from autohet.strategies._latency import SingleLatencyServed

        return SingleLatencyServed(pool.spec.executors[params["executor"]], model, sample.rows(0, 1)[0])

    def run(self, pool: Pool, ctx: RunContext, params: dict[str, Any]) -> Measurement:
        if not ctx.mode.per_request:
            return super().run(pool, ctx, params)
        from autohet.strategies._latency import latency_on_executor

        self.check_pool(pool, params)
        return latency_on_executor(pool, ctx, params["executor"], self.name, params)

    def slow_hint(self, pool: Pool, params: dict[str, Any]) -> str:
        return (f"executor {pool.names[params['executor']]} alone cannot finish in time; pick a faster executor "
                "(--set executor=N), fewer --images or a longer --timeout")

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        target = params["executor"] if params["executor"] in idle else idle[0]
        return [(target, state.remaining)]


class StaticScheduler(DataParallelStrategy):
    """Fixed shares w_i = W * r_i / sum(r), equal shares when no ratios are given."""

    name = "static"
    barrier = True
    params = {"ratios": FloatListParam("ratios", None, low=0.0, help="one weight per executor")}

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
    params = {"p": IntParam("p", 64, low=1, high=100000, help="probe size per executor"), "unit": UNIT}

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        return pool_suited(spec, {"unit": "batches", "p": 2}, {"unit": "batches", "p": 1})

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        if state.round_index == 1:
            return [(i, state.fixed_size(i, params["p"], params["unit"])) for i in idle]
        shares = split_by_weights(state.remaining, state.speed_weights(idle))
        return list(zip(idle, shares, strict=True))


class ChunkScheduler(DataParallelStrategy):
    """Rounds of w images: the first split equally, round k+1 by round k's speeds; barrier per round."""

    name = "chunk"
    barrier = True
    params = {"w": IntParam("w", 512, low=1, high=1000000, help="images per round")}

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        # round 1 is split equally: about one batch per executor, not 512 images on a one-core group; GPUs
        # alike in speed get eight batches each a round (a barrier per batch would idle them at every one)
        batches = sum(e.batch for e in spec.executors)
        return pool_suited(spec, {"w": batches}, {"w": batches}, {"w": 8 * batches})

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
        "s": IntParam("s", 128, low=1, high=1000000, help="initial chunk (images in round 1)"),
        "tol": FloatParam("tol", 0.1, low=0.0, high=1.0, help="finish times are close when (max-min)/max <= tol"),
    }

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        one_each = {"s": sum(e.batch for e in spec.executors)}
        return pool_suited(spec, one_each, one_each)

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
    params = {"c": IntParam("c", 128, low=1, high=1000000, help="chunk size"), "unit": UNIT}

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        return pool_suited(spec, {"unit": "batches", "c": 4}, {"unit": "batches", "c": 1})

    def assign(self, state: SchedState, idle: list[int], params: dict[str, Any]) -> Plan:
        return [(i, state.fixed_size(i, params["c"], params["unit"])) for i in idle]


class FastSplitScheduler(DataParallelStrategy):
    """Probe chunks of w_s until every executor finished one; then w_i = remaining * r * v_i / max(v);
    all of the rest once fewer than ``threshold`` images remain."""

    name = "fast_split"
    params = {
        "w_s": IntParam("w_s", 64, low=1, high=1000000, help="probe chunk"),
        "r": FloatParam("r", 0.5, low=0.01, high=1.0, help="fraction of the remaining work for the fastest"),
        "threshold": IntParam("threshold", 100, low=1, high=1000000, help="below it, the rest goes at once"),
        "unit": UNIT,
    }

    def suggested_defaults(self, spec: PoolSpec) -> dict[str, Any]:
        # settings that ran near the limit beside a GPU; a threshold counted in images hands a
        # CPU group a long tail at the end (docs/why.md, strategies/data_parallel.py)
        return pool_suited(spec, {"unit": "batches", "w_s": 2, "r": 0.8, "threshold": 1},
                           {"unit": "batches", "w_s": 1, "threshold": 1})

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
