"""OptunaSearch with the tune's staged first points (``autohet.tuning.initial``).

Stage one's singles are enqueued at once, as Optuna's first points always were. Each later stage
(the CPU group's other batches, the split probes, then the strategies) waits until every point before
it has reported, then goes in with each executor kind at its best single's settings so far: a
data-parallel trial on CPU groups runs OpenVINO bf16 where the singles found it fastest, not the pool
file's eager fp32; on the split probes' groups, the winning probe's. After every stage, once acquiring executors has
taken more than ``ACQUIRE_SHARE_CAP`` of the tune's time, or one more acquiring as long as the
longest so far would take it past that share of the tune's expected length (``expect``), each
sampled point keeps the pool dims of the best trial so far (its actors are alive) and each executor
kind at its best single's settings (their builds are kept): the sampler still picks the strategy and
its parameters, but starts no new topology and compiles no new executor setting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ray.tune.search.optuna import OptunaSearch

from autohet.core.objectives import PRIMARY_METRIC, ObjectiveSet, TrialKey
from autohet.core.settings import ACQUIRE_SHARE_CAP, NEGLIGIBLE_SHARE
from autohet.executors import executor_kind
from autohet.pool import PoolSpec
from autohet.strategies import is_baseline
from autohet.tuning.initial import CLOSE_TO_BEST, PROBES_MOST, Known, Stage, split_winner

__all__ = ["ACQUIRE_SHARE_CAP", "SingleKind", "StagedSearch"]



class StagedSearch(OptunaSearch):
    """``later``: the stages after the first, in order; ``kind_of(config)``: the executor kind a single's config ran on;
    ``objectives``: which figure makes a single best (the primary objective's); ``ahead``: the executor settings
    the first points will compile, in order (``FirstPoints.ahead``), for the pool manager to compile ahead."""

    def __init__(self, *args: Any, later: list[Stage] | None = None,
                 kind_of: Callable[[dict[str, Any]], str | None] | None = None,
                 objectives: ObjectiveSet | None = None, ahead: list[dict[str, dict[str, Any]]] | None = None,
                 opening: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ahead = list(ahead or [])
        self.opening = dict(opening) if opening else None  # the first point it suggests (``tuner._plan_ahead``)
        self._enqueued = len(kwargs.get("points_to_evaluate") or [])  # points the next stage waits for
        self._later = [stage for stage in later or [] if stage.points]
        self._kind_of = kind_of
        self._objectives = objectives
        self._configs: dict[str, dict[str, Any]] = {}
        self._finished = 0
        self.best: dict[str, tuple[float, dict[str, Any]]] = {}  # kind -> (figure, its exec.<kind>.* values)
        self.best_cpu_group: Any = None  # the pool.cpu_group_size the best CPU single ran at
        self.cpu_variants: dict[tuple[tuple[str, Any], ...], float] = {}  # a CPU single's exec.cpu.* but
        # the batch -> its best figure
        self.split_probes: list[tuple[float, Any, dict[str, Any]]] = []  # each ok split probe: its figure,
        # pool.cpu_group_size and exec.cpu.* values
        self._stage: Stage | None = None  # the later stage whose points are being suggested
        self._probes: set[str] = set()  # the trials of a split-probe stage
        self.best_pool: tuple[float, dict[str, Any]] | None = None  # the best trial's figure and pool.* values
        self.acquire_s = 0.0  # the finished trials' seconds acquiring executors
        self._reported: set[str] = set()  # trials whose result came back (``unreported``)
        self._suggested_at: dict[str, float] = {}  # trial -> wall clock of its suggestion
        self.longest_acquire_s = 0.0  # the longest one trial spent acquiring
        self.started: float | None = None  # wall clock of the first suggestion
        self.horizon: tuple[int, float] | None = None  # (trials in all, wall clock of the deadline)

    def expect(self, trials: int, budget_s: float) -> None:
        """The run ahead: at most ``trials`` more trials, within ``budget_s`` seconds from now."""
        self.horizon = (self._finished + trials, time.time() + budget_s)

    def acquire_share(self, now: float | None = None) -> float:
        """The finished trials' acquiring, as a share of the wall time since the first suggestion."""
        if self.started is None:
            return 0.0
        return self.acquire_s / max(1e-9, (time.time() if now is None else now) - self.started)

    def over_acquire_cap(self, now: float | None = None) -> bool:
        """Whether acquiring is past the cap already, or would be after one more acquiring as long as
        the longest so far, within the tune's expected length: the deadline, or sooner the trials
        left at the mean trial time so far."""
        now = time.time() if now is None else now
        if self.acquire_share(now) > ACQUIRE_SHARE_CAP:
            return True
        if self.horizon is None or self.started is None or self._finished == 0:
            return False
        trials, deadline = self.horizon
        per_trial = (now - self.started) / self._finished
        end = min(deadline, now + max(0, trials - self._finished) * per_trial)
        return self.acquire_s + self.longest_acquire_s > ACQUIRE_SHARE_CAP * (end - self.started)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.started is None:
            self.started = time.time()
        if self._later and len(self._configs) >= self._enqueued and self._finished < self._enqueued:
            return None  # Tune asks again: the stage before is still reporting, and the next one needs it
        while self._later and self._finished >= self._enqueued:  # a stage may fill to no point: the next
            self._stage = self._later.pop(0)
            points = [p for p in self._stage.filled(self.known()) if not self._ran(p)]
            for point in points:
                self._ot_study.enqueue_trial(point)
            self._enqueued += len(points)
        if not self._later and self._finished >= self._enqueued:
            self._keep_topology()
        config = super().suggest(trial_id)
        if config is not None:
            self._configs[trial_id] = config
            self._suggested_at[trial_id] = time.time()
            if self._stage is not None and self._stage.per_close_cpu and len(self._configs) <= self._enqueued:
                self._probes.add(trial_id)
        return config

    def _ran(self, point: dict[str, Any]) -> bool:
        """Whether an earlier trial ran ``point`` (its every value): the strategies' fifo point at the
        winning split probe's settings is that probe."""
        return any(all(config.get(k) == v for k, v in point.items()) for config in self._configs.values())

    def known(self) -> Known:
        """What the trials so far measured, for the next stage's points (``Stage.filled``)."""
        close: list[dict[str, Any]] = []
        if self.cpu_variants and self._objectives is not None:
            primary = self._objectives.primary
            ranked = sorted(self.cpu_variants.items(), key=lambda item: primary.rank(item[1]))
            top = ranked[0][1]
            close = [dict(variant) for variant, figure in ranked
                     if primary.share_of(figure, top) >= CLOSE_TO_BEST][:PROBES_MOST]
        split = None
        if self.split_probes and self._objectives is not None:
            group = self.split_probes[0][1]
            split = (group, split_winner([(f, values) for f, _, values in self.split_probes], self._objectives.primary))
        negligible: set[str] = set()
        if self._objectives is not None:
            primary = self._objectives.primary
            negligible = {kind for kind, (figure, _) in self.best.items() if any(
                primary.share_of(figure, other) < NEGLIGIBLE_SHARE for k, (other, _) in self.best.items() if k != kind)}
        return Known({kind: values for kind, (_, values) in self.best.items()}, self.best_cpu_group,
                     tuple(close), split, frozenset(negligible))

    def _keep_topology(self) -> None:
        """Over the acquire cap (``over_acquire_cap``), the next sampled point is asked with the best
        trial's pool dims and each kind's best single settings fixed (on the split probes' groups, the
        winning probe's), an enqueued partial point: Optuna samples the rest; stage two's own points go first."""
        import optuna

        if self.best_pool is None or not self.over_acquire_cap():
            return
        fixed = dict(self.best_pool[1])
        known = self.known()
        best = dict(known.best)
        if known.cpu_split is not None and fixed.get("pool.cpu_group_size") == known.cpu_split[0]:
            best["cpu"] = known.cpu_split[1]  # what was measured on these groups, not on the whole group
        for values in best.values():
            fixed.update(values)
        if not fixed or self._ot_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return
        self._ot_study.enqueue_trial(fixed)

    def unreported(self) -> list[tuple[str, dict[str, Any], float]]:
        """The trials suggested that never reported a result (every trial's has a ``status``): each one's id,
        config and wall clock of its suggestion."""
        return [(trial_id, config, self._suggested_at[trial_id]) for trial_id, config in self._configs.items()
                if trial_id not in self._reported]

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        super().on_trial_complete(trial_id, result, error)
        self._finished += 1
        if result and "status" in result:
            self._reported.add(trial_id)
        config = self._configs.get(trial_id) or {}
        acquired = float((result or {}).get(TrialKey.ACQUIRE) or 0.0)
        self.acquire_s += acquired
        self.longest_acquire_s = max(self.longest_acquire_s, acquired)
        value = (result or {}).get(PRIMARY_METRIC)
        if not result or result.get("status") != "ok" or value is None or self._objectives is None:
            return
        value, better = float(value), self._objectives.primary.better
        if self.best_pool is None or better(value, self.best_pool[0]):
            self.best_pool = (value, {k: v for k, v in config.items() if k.startswith("pool.")})
        cpu = {k: v for k, v in config.items() if k.startswith("exec.cpu.")}
        if trial_id in self._probes:
            self.split_probes.append((value, config.get("pool.cpu_group_size"), cpu))
            return
        kind = self._kind_of(config) if self._kind_of is not None and is_baseline(config.get("strategy")) else None
        if kind is None:
            return
        if executor_kind(kind).is_cpu:
            variant = tuple(sorted((k, v) for k, v in cpu.items() if k != "exec.cpu.batch"))
            if variant not in self.cpu_variants or better(value, self.cpu_variants[variant]):
                self.cpu_variants[variant] = value
        known = self.best.get(kind)
        if known is None or better(value, known[0]):
            self.best[kind] = (value, {k: v for k, v in config.items() if k.startswith(f"exec.{kind}.")})
            if executor_kind(kind).is_cpu:
                self.best_cpu_group = config.get("pool.cpu_group_size")


class SingleKind:
    """Picklable (Tune checkpoints its searcher): the kind of executor a ``single`` config ran on,
    in the topology its pool dims make of ``pool``."""

    def __init__(self, pool: PoolSpec) -> None:
        self.pool = pool

    def __call__(self, config: dict[str, Any]) -> str | None:
        from autohet.tuning.manager import regroup
        from autohet.tuning.space import SearchSpace

        _, params, _, pool_params = SearchSpace.decode(config)
        executors = regroup(self.pool, pool_params).executors
        index = params.get("executor")
        return executors[index].kind if isinstance(index, int) and 0 <= index < len(executors) else None
