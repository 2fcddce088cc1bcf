"""MetaSchedule tuning of blocks, in a child process so a TVM crash cannot take down the caller.

The parent imports each block to Relax, saves the IRModules as JSON in the tuning directory and
starts ``python -m autohet.backends._tvm_tune spec.json``. The child extracts the tuning tasks of
all blocks, merges tasks shared between blocks (resnet's repeated convolutions are tuned once),
and runs ``meta_schedule.tune_tasks`` with the trial budget into a JSON database in
``runs/tvm/<model>/<target-key>/``, which later runs reuse: blocks already tuned are skipped and
compilation applies the database. ``trials`` is the total number of measured candidates over all
tasks of the job, split evenly between tasks (``max_trials_per_task = ceil(trials / tasks)``).
Only convolution, matmul/dense and pooling tasks are tuned; the rest keep default schedules.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autohet.backends._tvm import fused_for_tuning, to_relax, tune_dir, tvm_target
from autohet.errors import UserError
from autohet.partition import Block

__all__ = ["TuneResult", "tune_blocks"]


@dataclass
class TuneResult:
    """What one tuning job did: blocks tuned and skipped, unique tasks, records now in the database."""

    work_dir: Path
    tuned: list[str]
    skipped: list[str]
    tasks: int
    records: int
    seconds: float
    log: Path


def _manifest(work_dir: Path) -> dict[str, dict]:
    path = work_dir / "tuned.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def tune_blocks(blocks: list[Block], model: str, device: str = "cpu", trials: int = 64, *,
                retune: bool = False, timeout_s: float = 1800.0, seed: int = 0) -> TuneResult:
    """Tunes the blocks' operators for ``device`` with ``trials`` measured candidates in total."""
    import tvm

    if trials < 1:
        raise UserError(f"--trials must be at least 1, got {trials}")
    target, key = tvm_target(device)
    work_dir = tune_dir(model, key)
    work_dir.mkdir(parents=True, exist_ok=True)
    done = _manifest(work_dir)
    todo = [b for b in blocks if retune or b.signature not in done]
    skipped = [b.name for b in blocks if b not in todo]
    log = work_dir / "tune.log"
    if not todo:
        return TuneResult(work_dir, [], skipped, 0, 0, 0.0, log)
    mod_paths = []
    for block in todo:
        mod, _ = to_relax(block, block.example_inputs())
        path = work_dir / "mods" / f"{block.signature}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(tvm.ir.save_json(fused_for_tuning(mod, target)))
        mod_paths.append(str(path))
    spec = {"modules": mod_paths, "target": target, "work_dir": str(work_dir), "trials": trials,
            "seed": seed, "result": str(work_dir / "last_job.json")}
    spec_path = work_dir / "job.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    start = time.perf_counter()
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autohet.backends._tvm_tune", str(spec_path)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise UserError(f"tuning ran past {timeout_s:.0f} s and was stopped; lower --trials "
                            f"(log: {log})") from None
    if rc != 0:
        raise UserError(f"tuning process failed with exit code {rc}; see {log}")
    result = json.loads(Path(spec["result"]).read_text())
    for block in todo:
        done[block.signature] = {"block": block.name, "trials": trials, "tasks": result["tasks"]}
    (work_dir / "tuned.json").write_text(json.dumps(done, indent=2))
    return TuneResult(work_dir, [b.name for b in todo], skipped, result["tasks"], result["records"],
                      time.perf_counter() - start, log)


_TUNED_OPS = ("conv", "matmul", "dense", "pool")


def _keep_builder_workers() -> None:
    """LocalBuilder restarts its worker processes for every batch, and each new worker spends ~16 s
    importing ``tvm.s_tir.tensor_intrin`` on a 2-core machine, which dwarfs the builds. In this
    child process only, the builder's pool is created once and kept."""
    from tvm.s_tir.meta_schedule.builder import local_builder

    real = local_builder.PopenPoolExecutor
    pools: dict[tuple, object] = {}

    class KeptPool:
        def __init__(self, max_workers: int, timeout: float | None = None, initializer=None) -> None:
            key = (max_workers, timeout)
            if key not in pools:
                pools[key] = real(max_workers=max_workers, timeout=timeout, initializer=initializer)
            self.pool = pools[key]

        def map_with_error_catching(self, fn, iterator):  # noqa: ANN001, ANN202
            return self.pool.map_with_error_catching(fn, iterator)

        def submit(self, fn, *args):  # noqa: ANN001, ANN202
            return self.pool.submit(fn, *args)

        def shutdown(self) -> None:
            """Kept for the next batch; the process exit ends the workers."""

    local_builder.PopenPoolExecutor = KeptPool


def _worker(spec_path: str) -> None:
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    _keep_builder_workers()
    spec = json.loads(Path(spec_path).read_text())
    target = tvm.target.Target(spec["target"])
    merged: dict[int, object] = {}
    weights: dict[int, float] = {}
    for path in spec["modules"]:
        mod = tvm.ir.load_json(Path(path).read_text())
        for task in ms.relax_integration.extract_tasks(mod, target):
            if not any(op in task.task_name for op in _TUNED_OPS):
                continue  # reshapes and transposes: default schedules are fine, trials go to real work
            h = tvm_ffi.structural_hash(task.dispatched[0])
            merged.setdefault(h, task)
            weights[h] = weights.get(h, 0.0) + float(task.weight)
    tasks = list(merged.values())
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, spec["work_dir"], seed=spec["seed"])
    task_weights = [weights[h] for h in merged]
    per_task = max(1, math.ceil(spec["trials"] / max(1, len(contexts))))
    print(f"tuning {len(contexts)} tasks, {spec['trials']} trials total, {per_task} per task", flush=True)
    database = ms.tune_tasks(
        tasks=contexts, task_weights=task_weights, work_dir=spec["work_dir"],
        max_trials_global=spec["trials"], max_trials_per_task=per_task,
        num_trials_per_iter=min(64, per_task),
        builder=ms.builder.LocalBuilder(timeout_sec=120.0),
    )
    records = len(database.get_all_tuning_records())
    Path(spec["result"]).write_text(json.dumps({"tasks": len(contexts), "records": records}))


if __name__ == "__main__":
    _worker(sys.argv[1])
