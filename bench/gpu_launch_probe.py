"""How much of a GPU executor's time is Python launching its kernels, and what a busy Python thread
beside it costs (issue 27: why ``autohet.load``'s stream, whose reader, stager and driver are threads
of the executor's process, trailed the tune's actor). One process, the config's first executor:

- a chain of 2048-image units, each next one announced (``run_ahead``) or not, and one whole unit;
- the Python time to queue 20 batches (``launch``) against their GPU time;
- the announced chain again with a spinning Python thread in the process.

    python -m bench.gpu_launch_probe --config runs/resnet18/best.yaml
"""

from __future__ import annotations

import argparse
import threading
import time


def main() -> None:
    import torch

    from autohet.config import load_config
    from autohet.executors import make_executor
    from autohet.workload import workload_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--images", type=int, default=40000)
    args = parser.parse_args()
    cfg = load_config(args.config)
    spec = cfg.pool.executors[int(cfg.params.get("executor", 0))]
    ex = make_executor(spec, cfg.model)
    ex.load(workload_for(cfg.model.name, args.images, 0))
    n = args.images

    def chain(unit: int, ahead: bool) -> float:
        start, done = time.perf_counter(), 0
        while done < n:
            size = min(unit, n - done)
            following = (done + size, min(unit, n - done - size)) if ahead and done + size < n else None
            ex.run_ahead(done, size, following)
            done += size
        torch.cuda.synchronize()
        return n / (time.perf_counter() - start)

    for _ in range(2):
        print(f"units of 2048 announced {chain(2048, True):.0f} img/s, not announced {chain(2048, False):.0f}, "
              f"one unit {chain(n, False):.0f}", flush=True)
    batches = 20
    start = time.perf_counter()
    handle = ex.launch(0, spec.batch * batches)
    queued = time.perf_counter() - start
    ex.collect(handle)
    print(f"queuing {batches} batches: {1e3 * queued:.1f} ms of Python; with their GPU work "
          f"{1e3 * (time.perf_counter() - start):.1f} ms")
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        print(f"with a spinning Python thread: units of 2048 announced {chain(2048, True):.0f} img/s")
    finally:
        stop.set()
        thread.join()


if __name__ == "__main__":
    main()
