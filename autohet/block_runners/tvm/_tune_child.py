"""The tuning child process: MetaSchedule tunes the blocks of the jobs its parent (``_tune_parent``)
sends it, so that a TVM crash cannot take down the caller.

Started as ``python -m autohet.block_runners.tvm._tune_child --serve TARGET READY_FILE``: it sets up
MetaSchedule's builder and runner once (their workers kept across batches), touches READY_FILE, then
reads job spec paths from stdin, one per line, runs each (``_run_job``: extract the tasks of all
modules, merge shared ones, ``tune_tasks`` into the JSON database, stop proposing candidates past the
budget's deadline) and writes its result file, until stdin closes. ``python -m ... SPEC`` runs one job.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autohet.block_runners.tvm._runner import import_tensor_intrin
from autohet.block_runners.tvm._toolchain import ensure_cuda

_TUNED_OPS = ("conv", "matmul", "dense", "pool")
_POOLS: dict[tuple, Any] = {}


def _keep_builder_workers() -> None:
    """LocalBuilder restarts its worker processes for every batch, and each new worker spends far longer
    importing ``tvm.s_tir.tensor_intrin`` than the builds take (docs/why.md, block_runners/tvm). In this
    child process only, the builder's pool is created once and kept."""
    from tvm.s_tir.meta_schedule.builder import local_builder

    real = local_builder.PopenPoolExecutor

    class KeptPool:
        def __init__(self, max_workers: int, timeout: float | None = None, initializer=None) -> None:  # noqa: ANN001
            key = (max_workers, timeout)
            if key not in _POOLS:
                _POOLS[key] = real(max_workers=max_workers, timeout=timeout, initializer=initializer)
            self.pool = _POOLS[key]

        def map_with_error_catching(self, fn, iterator):  # noqa: ANN001, ANN202
            return self.pool.map_with_error_catching(fn, iterator)

        def submit(self, fn, *args):  # noqa: ANN001, ANN202
            return self.pool.submit(fn, *args)

        def shutdown(self) -> None:
            """Kept for the next batch; the process exit ends the workers."""

    local_builder.PopenPoolExecutor = KeptPool


def _deadline_strategy(deadline: list[float | None], population: int | None = None) -> Any:
    """MetaSchedule's evolutionary search, except that it proposes no more candidates once
    ``deadline[0]`` (a monotonic time) has passed: the task scheduler then ends each task cleanly,
    measured candidates still go to the database, and ``tune_tasks`` returns."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy, SearchStrategy

    @derived_object
    class Deadline(PySearchStrategy):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def _initialize_with_tune_context(self, context: Any) -> None:
            _ffi_api.SearchStrategyInitializeWithTuneContext(self.inner, context)

        def pre_tuning(self, *args: Any) -> None:  # the arguments differ between TVM versions
            _ffi_api.SearchStrategyPreTuning(self.inner, *args)

        def post_tuning(self) -> None:
            _ffi_api.SearchStrategyPostTuning(self.inner)

        def generate_measure_candidates(self) -> Any:
            if deadline[0] is not None and time.monotonic() > deadline[0]:
                deadline.append("passed")
                return None
            return _ffi_api.SearchStrategyGenerateMeasureCandidates(self.inner)

        def notify_runner_results(self, *args: Any) -> None:
            _ffi_api.SearchStrategyNotifyRunnerResults(self.inner, *args)

        def clone(self) -> Any:
            return Deadline(_ffi_api.SearchStrategyClone(self.inner))

    options = {} if not population else {"population_size": int(population),
                                          "init_min_unmeasured": min(50, int(population))}
    return Deadline(SearchStrategy.create("evolutionary", **options))


def _watch(progress: Path, start: float) -> Any:
    """A measure callback that counts candidates, keeps the first error and writes progress."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class Watch(PyMeasureCallback):
        def __init__(self) -> None:
            super().__init__()
            self.state = {"trials_done": 0, "valid": 0, "first_error": ""}
            self.ran_tasks: set[int] = set()

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):  # noqa: ANN001
            state = self.state
            for built, ran in zip(builder_results, runner_results, strict=False):
                state["trials_done"] += 1
                error = built.error_msg or ran.error_msg
                secs = [float(getattr(s, "value", s)) for s in (ran.run_secs or [])]
                if error is None and secs and max(secs) < 1e9:
                    state["valid"] += 1
                    self.ran_tasks.add(int(task_id))
                elif not state["first_error"]:
                    state["first_error"] = str(error or "no run time")[:4000]
            state["tune_s"] = round(time.monotonic() - start, 1)
            print(f"[{state['tune_s']:.0f} s] task {task_id}: {state['trials_done']} candidates measured, "
                  f"{state['valid']} ran", flush=True)
            tmp = Path(str(progress) + ".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(progress)

    return Watch()


def _run_job(spec: dict[str, Any], builder: Any, runner: Any) -> dict[str, Any]:
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    start = time.monotonic()
    budget, stop_at = spec.get("budget_s"), spec.get("stop_at")
    target = tvm.target.Target(spec["target"])
    merged: dict[int, object] = {}
    weights: dict[int, float] = {}
    owners: dict[str, set[int]] = {}  # module path -> the hashes of its tuned tasks
    for path in spec["modules"]:
        mod = tvm.ir.load_json(Path(path).read_text())
        owners[path] = set()
        for task in ms.relax_integration.extract_tasks(mod, target):
            if not any(op in task.task_name for op in _TUNED_OPS):
                continue  # reshapes and transposes: default schedules are fine, trials go to real work
            h = tvm_ffi.structural_hash(task.dispatched[0])
            merged.setdefault(h, task)
            weights[h] = weights.get(h, 0.0) + float(task.weight)
            owners[path].add(h)
    tasks = list(merged.values())
    if not tasks:
        return {"tasks": 0, "trials_done": 0, "valid": 0, "timed_out": False, "first_error": "",
                "coverage": {path: [0, 0] for path in owners}}
    deadline: list[Any] = [None if stop_at is None else time.monotonic() + float(stop_at) - time.time()]
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, spec["work_dir"], strategy=_deadline_strategy(deadline, spec.get("population")), seed=spec["seed"])
    task_weights = [weights[h] for h in merged]
    per_task = max(1, math.ceil(spec["trials"] / max(1, len(contexts))))
    per_iter = min(int(spec.get("per_iter") or 64), per_task)
    setup_s = time.monotonic() - start
    watch = _watch(Path(spec["progress"]), start)
    print(f"tuning {len(contexts)} tasks, {spec['trials']} trials total, {per_task} per task"
          + (f", budget {float(budget):.0f} s" if budget is not None else "")
          + f" (set up in {setup_s:.1f} s)", flush=True)
    ms.tune_tasks(
        tasks=contexts, task_weights=task_weights, work_dir=spec["work_dir"],
        max_trials_global=spec["trials"], max_trials_per_task=per_task,
        num_trials_per_iter=per_iter, builder=builder, runner=runner,
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), watch],
    )
    timed_out = len(deadline) > 1
    if timed_out:
        print(f"budget of {float(budget):.0f} s reached; the tasks' searches were ended, records kept", flush=True)
    hashes = list(merged)  # task_id order: extracted_tasks_to_tune_contexts keeps the order (none are skipped)
    ran = {hashes[i] for i in watch.ran_tasks if len(contexts) == len(hashes)}
    coverage = {path: [len(hs & ran), len(hs)] for path, hs in owners.items()}
    return {"tasks": len(contexts), **watch.state, "timed_out": timed_out, "setup_s": round(setup_s, 1),
            "tune_s": round(time.monotonic() - start, 1), "coverage": coverage}


def _make_builder_runner(target: dict[str, Any]) -> tuple[Any, Any]:
    """MetaSchedule's local builder and runner. The builder's workers start at once and import
    tensor_intrin while this process does too (one worker on a machine of fewer than 4 cores, where
    builds take ~0.02 s and a second import would only compete); on CUDA both builder and runner
    workers get the parent's kernel compiler and runtime."""
    from tvm.s_tir import meta_schedule as ms

    from autohet.block_runners.tvm._runner import export_so, warm_worker
    from autohet.block_runners.tvm._toolchain import cuda_worker_init
    from autohet.platform.fingerprint import usable_cores

    _keep_builder_workers()
    cores = usable_cores()
    workers = cores if cores >= 4 else 1
    if target["kind"] != "cuda":
        builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=120.0)
        runner = "local"
    else:
        ensure_cuda(target)  # mode from the parent's environment: no probing here
        builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=120.0, initializer=cuda_worker_init,
                                          f_export=export_so)
        runner = ms.runner.LocalRunner(
            timeout_sec=30.0, initializer=cuda_worker_init,
            evaluator_config=ms.runner.EvaluatorConfig(number=10, repeat=1, min_repeat_ms=20))
    for pool in _POOLS.values():
        for _ in range(workers):
            pool.submit(warm_worker)
    return builder, runner


def _write_result(path: str, result: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def _serve(target: dict[str, Any], ready: str) -> None:
    """Reads job spec paths from stdin, one per line, and runs them in turn until stdin closes; touches
    ``ready`` once set up."""
    start = time.monotonic()
    builder, runner = _make_builder_runner(target)
    import_tensor_intrin()  # every job needs it; imported while the workers do too

    print(f"tuning child ready in {time.monotonic() - start:.1f} s", flush=True)
    Path(ready).touch()
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(Path(line.strip()).read_text())
        try:
            result = _run_job(spec, builder, runner)
        except Exception as err:  # noqa: BLE001 - reported to the parent; the session stays usable
            traceback.print_exc()
            sys.stdout.flush()
            result = {"error": f"{type(err).__name__}: {err}"[-3000:]}
        _write_result(spec["result"], result)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve(json.loads(sys.argv[2]), sys.argv[3])
    else:  # one job from a spec file
        job = json.loads(Path(sys.argv[1]).read_text())
        made = _make_builder_runner(job["target"])
        import_tensor_intrin()
        _write_result(job["result"], _run_job(job, *made))
