"""Issue 4, TVM on the GPU: per-block batch-1 times of PyTorch and of MetaSchedule-tuned TVM, side by side.

For each model: MetaSchedule tunes all its blocks for at most --budget-s seconds (the tuning `autohet
compile` does: one child process, here kept across models, databases under runs/tvm/<model>/<target>/),
then for each block: torch ms and tuned TVM ms (fp32, batch 1, mean of --runs runs after 3 warm-up runs,
inputs already on the device), their ratio and the largest output difference. Lines are printed as they
are measured and the JSON is rewritten after each block. The run stays inside --total-s: later models'
tuning budgets shrink and blocks are skipped rather than run over, and a watchdog writes what there is,
kills the tuning process and exits at the limit.

    python -m bench.tvm_gpu --models resnet18,vgg16,googlenet --budget-s 120 --total-s 500   # GPU machine
    python -m bench.tvm_gpu --smoke                                  # CPU (llvm): lenet, a few trials, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

T0 = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
# Seconds kept back for compiling and timing one model's blocks after its tuning, and for one block.
RESERVE_S = {"cuda": 45.0, "cpu": 25.0}
PER_BLOCK_S = {"cuda": 4.0, "cpu": 6.0}


def left(total_s: float) -> float:
    return total_s - (time.monotonic() - T0)


class Report:
    """The results so far, written to ``path`` after every change."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"bench": "tvm_gpu", **meta, "models": [], "complete": False}
        self._lock = threading.Lock()

    def write(self) -> None:
        with self._lock:
            self.data["elapsed_s"] = round(time.monotonic() - T0, 1)
            self.data["rows"] = self.rows()  # flat, as bench._common.emit writes them
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            tmp.replace(self.path)

    def rows(self) -> list[dict[str, Any]]:
        return [{"model": m["model"], **r} for m in self.data["models"] for r in m["blocks"]]


def _max_diff(a: Any, b: Any) -> float:
    a = a if isinstance(a, tuple | list) else (a,)
    b = b if isinstance(b, tuple | list) else (b,)
    return max(float((x.float().cpu() - y.float().cpu()).abs().max()) for x, y in zip(a, b, strict=True))


def _merge(results: list[Any]) -> Any:
    """One TuneResult for a model tuned as several jobs (sums; the last job's paths)."""
    from dataclasses import replace

    last = results[-1]
    blocks: dict[str, Any] = {}
    for r in results:
        blocks.update(r.extra.get("blocks", {}))
    return replace(last, tuned=[t for r in results for t in r.tuned],
                   tasks=sum(r.tasks for r in results), trials_done=sum(r.trials_done for r in results),
                   valid=sum(r.valid for r in results), seconds=sum(r.seconds for r in results),
                   timed_out=any(r.timed_out for r in results), skipped=[s for r in results for s in r.skipped],
                   first_error=next((r.first_error for r in results if r.first_error), ""),
                   extra={**last.extra, "blocks": blocks, "jobs": len(results)})


def _summary(report: Report) -> None:
    from bench._common import emit

    rows = report.rows()
    if rows:
        emit("tvm_gpu: torch vs tuned TVM per block (ms)", rows,
             ["model", "block", "torch_ms", "tvm_ms", "tvm_over_torch", "max_abs_diff", "tvm"], None)
    for m in report.data["models"]:
        t = m.get("tuning", {})
        print(f"{m['model']}: {t.get('trials_done', 0)} trials ({t.get('valid', 0)} ran) over {t.get('tasks', 0)} "
              f"tasks in {t.get('seconds', 0):.0f} s{' (budget reached)' if t.get('timed_out') else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,vgg16,googlenet")
    parser.add_argument("--budget-s", type=float, default=120.0, help="tuning seconds per model at most")
    parser.add_argument("--total-s", type=float, default=500.0, help="wall seconds for the whole run")
    parser.add_argument("--trials", type=int, default=3000,
                        help="measured candidates per model at most (split over its tasks); the budget usually "
                             "ends tuning first")
    parser.add_argument("--per-iter", type=int, default=32,
                        help="candidates per task and search round (MetaSchedule's default is 64; fewer spreads a "
                             "short budget over more tasks)")
    parser.add_argument("--population", type=int, default=128,
                        help="evolutionary search population (MetaSchedule's default is 512; 128 searches a round "
                             "~3x faster, which a short budget needs)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per block after 3 warm-up runs")
    parser.add_argument("--retune", action="store_true", help="tune blocks again even if already tuned")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda: the GPU (sm_xx from the device); cpu: LLVM for this host's CPU")
    parser.add_argument("--per-block", action="store_true", help="one tuning job per block, equal budget shares")
    parser.add_argument("--blocks", help="comma-separated block names: tune and time only these")
    parser.add_argument("--smoke", action="store_true", help="CPU (llvm), lenet, a few trials")
    parser.add_argument("--out", help="JSON path (default $OUT/tvm_gpu.json, else bench/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        device, models = "cpu", ["lenet"]
        # 2 trials end it; the budget is only a backstop, many times that: at 150 s a 2-core box loaded by
        # other jobs (load average 3.5) measured no trial in time
        args.trials, args.budget_s, args.total_s = min(args.trials, 2), 400.0, 500
        # a small search population: on two cores the evolutionary search, not the measuring, is the cost
        args.population, args.per_iter = min(args.population, 32), min(args.per_iter, 4)
    else:
        device, models = args.device, [m.strip() for m in args.models.split(",") if m.strip()]
    name = "tvm_gpu_smoke.json" if args.smoke else f"tvm_{'gpu' if device == 'cuda' else 'cpu'}.json"
    out = Path(args.out) if args.out else Path(os.environ["OUT"]) / name if os.environ.get("OUT") else (
        REPO / "bench" / "results" / name)

    import torch
    import tvm

    from autohet.block_runners import TorchRunner, TvmRunner, time_runner
    from autohet.block_runners.tvm import TuneSession, ensure_cuda, tvm_root, tvm_target
    from autohet.core.errors import UserError
    from autohet.partition import partition
    from bench._common import describe_machine

    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch; use --smoke for the CPU path", flush=True)
        return 2
    target, key = tvm_target(device)
    try:
        compiler = ensure_cuda(target) if device == "cuda" else "llvm"
    except UserError as err:
        print(f"tvm_gpu: {err}", flush=True)
        return 2
    tf32 = bool(device == "cuda" and torch.backends.cudnn.allow_tf32)
    report = Report(out, {"machine": describe_machine(), "device": device, "target": target, "tvm": tvm.__version__,
                          "torch": torch.__version__, "cuda_compiler": compiler, "args": vars(args),
                          "torch_conv_tf32": tf32, "torch_matmul_tf32": torch.backends.cuda.matmul.allow_tf32})
    print(f"tvm_gpu: {describe_machine()}; TVM {tvm.__version__}, target {key}, kernels compiled with {compiler}; "
          f"models {','.join(models)}, tuning <= {args.budget_s:.0f} s each, total <= {args.total_s:.0f} s; "
          f"JSON {out}", flush=True)
    if device == "cuda":
        print(f"torch: fp32 tensors, cuDNN convolutions {'may use TF32' if tf32 else 'in full fp32'} (torch's "
              f"default), matmul TF32 {torch.backends.cuda.matmul.allow_tf32}; TVM: full fp32", flush=True)
    report.write()
    session = TuneSession(device)
    done = threading.Event()

    def stop(reason: str) -> None:
        if done.is_set():
            return
        done.set()
        print(f"\n{reason}: stopping with what there is", flush=True)
        session.kill()
        report.write()
        _summary(report)
        sys.stdout.flush()
        os._exit(3)

    reason = f"total time of {args.total_s:.0f} s reached"
    watchdog = threading.Timer(max(1.0, left(args.total_s)), stop, args=(reason,))
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGTERM, lambda *_: stop("SIGTERM"))
    reserve, per_block = RESERVE_S[device], PER_BLOCK_S[device]
    try:
        session.start(tvm_root() / f"tune-{key}.log")  # the child imports TVM while we import the first model
        for i, model in enumerate(models):
            remaining = len(models) - i
            share = (left(args.total_s) - 5.0) / remaining - reserve
            budget = min(args.budget_s, share)
            entry: dict[str, Any] = {"model": model, "blocks": [], "tuning": {}}
            coverage: dict[str, list[int]] = {}
            report.data["models"].append(entry)
            graph = partition(model, batch=1)
            blocks = list(graph.blocks)
            if args.blocks:
                wanted = [b.strip() for b in args.blocks.split(",") if b.strip()]
                unknown = sorted(set(wanted) - {b.name for b in blocks})
                if unknown:
                    print(f"tvm_gpu: {model} has no block {unknown[0]!r}; blocks: "
                          f"{', '.join(b.name for b in blocks)}", flush=True)
                    return 2
                blocks = [b for b in blocks if b.name in wanted]
            print(f"\n== {model}: {len(blocks)} blocks; tuning for up to {max(budget, 0):.0f} s "
                  f"({left(args.total_s):.0f} s left in all)", flush=True)
            if budget >= 15.0:
                last = [0.0]

                def progress(state: dict[str, Any], model: str = model, last: list[float] = last) -> None:
                    if time.monotonic() - last[0] >= 15.0:
                        last[0] = time.monotonic()
                        print(f"   tuning {model}: {state.get('tune_s', 0):.0f} s, {state.get('trials_done', 0)} "
                              f"candidates measured, {state.get('valid', 0)} ran", flush=True)

                try:
                    jobs = [[b] for b in blocks] if args.per_block else [blocks]
                    results = []
                    model_end = time.monotonic() + budget
                    for k, job in enumerate(jobs):
                        job_budget = (model_end - time.monotonic()) / (len(jobs) - k)
                        if job_budget < 3.0:
                            print(f"   {job[0].name}: no tuning time left", flush=True)
                            continue
                        hard = max(job_budget + 60.0, 30.0)
                        hard = min(hard, left(args.total_s) - reserve / 2)
                        part = session.tune(job, graph.model, max(1, args.trials // len(jobs)), retune=args.retune,
                                            budget_s=job_budget, timeout_s=hard, per_iter=args.per_iter,
                                            population=args.population, progress=progress)
                        results.append(part)
                        coverage.update(part.extra.get("blocks", {}))
                        if args.per_block:
                            print(f"   tuned {job[0].name}: {part.trials_done} trials ({part.valid} ran) in "
                                  f"{part.seconds:.0f} s", flush=True)
                    if not results:
                        raise UserError("no tuning job ran (the budget was too small)")
                    result = _merge(results)
                    entry["tuning"] = {"tasks": result.tasks, "trials_done": result.trials_done,
                                       "valid": result.valid, "records": result.records,
                                       "seconds": round(result.seconds, 1), "timed_out": result.timed_out,
                                       "skipped_blocks": result.skipped, "first_error": result.first_error[-2000:],
                                       "database": str(result.work_dir), "log": str(result.log), **result.extra}
                    print(f"   tuned: {result.trials_done} trials ({result.valid} ran) over {result.tasks} tasks "
                          f"in {result.seconds:.0f} s{' (budget reached)' if result.timed_out else ''}; "
                          f"{result.records} records in {result.work_dir}"
                          + (f"; already tuned: {len(result.skipped)} blocks" if result.skipped else ""), flush=True)
                    if result.trials_done and not result.valid:
                        print(f"   warning: no candidate ran; first error: {result.first_error[-400:]!r}", flush=True)
                except UserError as err:
                    entry["tuning"] = {"error": str(err)}
                    print(f"   tuning failed: {err}", flush=True)
            else:
                entry["tuning"] = {"skipped": f"only {max(budget, 0):.0f} s left for tuning"}
                print("   not tuned: too little time left; TVM below uses the database as it is", flush=True)
            report.write()
            session.wait_ready(max(0.0, left(args.total_s) - reserve))  # an idle child: quiet CPUs for timing
            print(f"   {'block':<28} {'torch ms':>9} {'tvm ms':>9} {'tvm/torch':>9} {'max|diff|':>10}  tvm "
                  "(tasks with a measured schedule in this run / tuned tasks of the block)", flush=True)
            for block in blocks:
                if left(args.total_s) < per_block:
                    print(f"   {block.name:<28} skipped: total time nearly spent", flush=True)
                    continue
                row: dict[str, Any] = {"block": block.name}
                try:
                    inputs = block.example_inputs(device)
                    torch_runner = TorchRunner(block, device)
                    t_torch = time_runner(torch_runner, inputs, args.runs)
                    row["torch_ms"] = 1e3 * sum(t_torch) / len(t_torch)
                    start = time.monotonic()
                    tvm_runner = TvmRunner(block, device, model=graph.model, cache=False)
                    row["compile_s"] = round(time.monotonic() - start, 2)
                    row["tvm"] = "tuned" if tvm_runner.tuned else "untuned"
                    if block.name in coverage:
                        row["tasks_measured"], row["tasks"] = coverage[block.name]
                        row["tvm"] += f" {row['tasks_measured']}/{row['tasks']}"
                    with torch.no_grad():
                        want = torch_runner(*inputs)
                        row["max_abs_diff"] = _max_diff(tvm_runner(*inputs), want)
                        row["max_abs_ref"] = max(float(y.float().abs().max()) for y in (
                            want if isinstance(want, tuple | list) else (want,)))
                    t_tvm = time_runner(tvm_runner, inputs, args.runs)
                    row["tvm_ms"] = 1e3 * sum(t_tvm) / len(t_tvm)
                    row["tvm_over_torch"] = row["tvm_ms"] / row["torch_ms"]
                    print(f"   {block.name:<28} {row['torch_ms']:>9.3f} {row['tvm_ms']:>9.3f} "
                          f"{row['tvm_over_torch']:>9.2f} {row['max_abs_diff']:>10.2e}  {row['tvm']}", flush=True)
                except Exception as err:  # noqa: BLE001 - one block's failure must not end the run
                    row["error"] = f"{type(err).__name__}: {err}"[-2000:]
                    first = str(err).strip().splitlines()[:1] or [""]
                    print(f"   {block.name:<28} failed: {type(err).__name__}: {first[0][:300]}", flush=True)
                entry["blocks"].append(row)
                report.write()
        report.data["complete"] = True
    finally:
        if not done.is_set():
            done.set()
            watchdog.cancel()
            session.close(timeout_s=min(20.0, left(args.total_s) - 2.0))
            report.write()
    _summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
