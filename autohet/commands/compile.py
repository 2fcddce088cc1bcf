"""``autohet compile``: MetaSchedule-tune a model's blocks with TVM, fill the cache, compare with torch."""

from __future__ import annotations

import argparse

from autohet.core.errors import UserError

__all__ = ["register", "handler"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``compile`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "compile", help="tune and compile a model's blocks with TVM; print torch vs TVM times",
        description="Tunes the selected blocks with MetaSchedule in a child process (database under "
                    "runs/tvm/<model>/<target>/, reused by later runs; blocks already tuned are skipped "
                    "unless --retune), compiles them into runs/tvm/cache/, and prints each block's mean "
                    "time over 10 runs after warm-up with torch and with TVM.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", default="tvm", choices=["tvm"], help="compiler backend (tvm)")
    parser.add_argument("--target", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--trials", type=int, default=64,
                        help="measured candidates in total for the whole job (split evenly over the "
                             "distinct conv/matmul/pool tasks of the selected blocks); 0 = no tuning")
    parser.add_argument("--blocks", default="all", help="'all' or comma-separated block names or indices")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--retune", action="store_true", help="tune blocks again even if already tuned")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds before the tuning process is killed (an error unless --budget is given)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of tuning after which no new candidates are tried; what was measured "
                             "by then is kept and used (default: no limit but --trials and --timeout)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per block after warm-up")
    parser.set_defaults(func=handler)
    return parser


def _select(graph: object, spec: str) -> list:
    if spec == "all":
        return list(graph.blocks)
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item.isdigit() and int(item) < len(graph.blocks):
            out.append(graph.blocks[int(item)])
        elif item in graph.names:
            out.append(graph[item])
        else:
            raise UserError(f"unknown block {item!r} for --blocks; valid: all, 0..{len(graph.blocks) - 1}, "
                            f"or names from `autohet graph --model {graph.model}`")
    return out


def handler(args: argparse.Namespace) -> int:
    from autohet.block_runners import TorchRunner, TvmRunner, parse_device, time_runner, tune_blocks
    from autohet.partition import partition

    if args.trials < 0:
        raise UserError(f"--trials must be 0 or more, got {args.trials}")
    if args.runs < 1:
        raise UserError(f"--runs must be at least 1, got {args.runs}")
    if args.budget is not None and args.budget <= 0:
        raise UserError(f"--budget must be positive, got {args.budget}")
    device = str(parse_device(args.target))
    graph = partition(args.model, batch=args.batch)
    blocks = _select(graph, args.blocks)
    if args.trials > 0:
        timeout = args.timeout if args.budget is None else max(args.timeout, args.budget + 120.0)
        result = tune_blocks(blocks, graph.model, device, args.trials, retune=args.retune,
                             timeout_s=timeout, budget_s=args.budget)
        if result.tuned:
            stop = " (stopped by --budget)" if result.timed_out else ""
            print(f"tuned {len(result.tuned)} block(s), {result.tasks} task(s), {result.trials_done} of "
                  f"{args.trials} trials ({result.valid} built and ran) in {result.seconds:.0f} s{stop}; "
                  f"database {result.work_dir} ({result.records} records)", flush=True)
            if result.trials_done and not result.valid:
                first = result.first_error.strip().splitlines()[-1:] or [""]
                print(f"warning: no candidate built and ran; first error: {first[0][:300]} (log: {result.log})")
        if result.skipped:
            print(f"already tuned, skipped: {', '.join(result.skipped)} (--retune to tune again)")
    print(f"mean (median) ms of {args.runs} runs after 3 warm-up runs, batch {args.batch}, {device}")
    print(f"{'block':<28} {'torch ms':>16} {'tvm ms':>16} {'tvm/torch':>10}  library")
    for block in blocks:
        inputs = block.example_inputs(device)
        # torch first: TVM's thread pool keeps spinning briefly after a call and would slow torch down
        t_torch = time_runner(TorchRunner(block, device), inputs, args.runs)
        tvm_runner = TvmRunner(block, device, model=graph.model)
        t_tvm = time_runner(tvm_runner, inputs, args.runs)
        ms_torch, ms_tvm = 1e3 * sum(t_torch) / len(t_torch), 1e3 * sum(t_tvm) / len(t_tvm)
        state = ("tuned" if tvm_runner.tuned else "untuned") + (", cached" if tvm_runner.from_cache else "")
        print(f"{block.name:<28} {_fmt(ms_torch, t_torch)} {_fmt(ms_tvm, t_tvm)} {ms_tvm / ms_torch:>10.2f}  "
              f"{state}", flush=True)
    return 0


def _fmt(mean_ms: float, times: list[float]) -> str:
    median = 1e3 * sorted(times)[len(times) // 2]
    return f"{mean_ms:>7.3f} ({median:>6.3f})"
