"""The most request bodies this machine's loopback HTTP carries to ``autohet serve``'s ingress server,
without anything behind it: the ceiling of a served throughput (issue 28).

``--servers`` processes run the ingress's own HTTP server (``autohet.service.listener``) on one port
(SO_REUSEPORT), each answering every body with a small JSON as soon as it is read; ``--clients``
aiohttp clients in ``--client-procs`` processes send ``--mb`` MB bodies for ``--seconds``, as
``bench.serve_load`` does. Prints bodies' MB/s, req/s, img/s at resnet18's 150528 bytes per uint8
image, and the CPU of the servers and clients.

    python -m bench.http_ceiling --servers 7 --clients 64 --client-procs 4 --mb 9.6 --seconds 10
    python -m bench.http_ceiling --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import Any

from bench._common import emit
from bench._procs import Snapshot, busiest

RESNET18_PIXELS = 3 * 224 * 224


class _Counting:
    """Admits every request and answers it once its body is read."""

    def begin(self, head: Any) -> Any:
        from autohet.service.listener import Admitted, Reply

        async def run(body: memoryview) -> Reply:
            return Reply(200, b'{"ok":true}')

        return Admitted(run, lambda: None)

    def error(self, status: int, reason: str) -> Any:
        from autohet.service.listener import Reply

        return Reply(status, reason.encode())


def _serve(port: int, max_body: int, ready: Any) -> None:
    from autohet.service.listener import Listener, bind_shared

    async def main() -> None:
        listener = Listener(_Counting(), bind_shared("127.0.0.1", port), max_body)
        await listener.ready
        ready.release()
        await asyncio.Event().wait()

    asyncio.run(main())


def _clients(port: int, clients: int, body: bytes, seconds: float, conn: Any) -> None:
    import aiohttp

    async def main() -> tuple[int, float]:
        done = 0
        url = f"http://127.0.0.1:{port}/v1/predict"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients + 4)) as session:
            deadline = time.perf_counter() + seconds

            async def client() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    async with session.post(url, data=body, headers={"Content-Type": "application/x-npy"}) as r:
                        await r.read()
                        done += r.status == 200

            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            return done, time.perf_counter() - start

    cpu = time.process_time()
    done, wall = asyncio.run(main())
    conn.send((done, wall, time.process_time() - cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--mb", type=float, default=9.6, help="body size in MB (9.6: 64 uint8 resnet18 images)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true", help="1 server, 2 clients in 2 processes, 0.2 MB, 1 s")
    parser.add_argument("--out", help="write the row as JSON")
    args = parser.parse_args()
    if args.smoke:
        args.servers, args.clients, args.client_procs, args.mb, args.seconds = 1, 2, 2, 0.2, 1.0
    if min(args.servers, args.clients, args.client_procs) < 1 or args.client_procs > args.clients:
        parser.error("--servers, --clients and --client-procs must be at least 1, --client-procs at most --clients")
    from bench.serve_load import free_port

    port, size = free_port(), int(args.mb * 1e6)
    body = os.urandom(size)
    context = multiprocessing.get_context("spawn")
    ready = context.Semaphore(0)
    servers = [context.Process(target=_serve, args=(port, 2 * size, ready), daemon=True) for _ in range(args.servers)]
    for s in servers:
        s.start()
    for _ in servers:
        if not ready.acquire(timeout=60):
            raise SystemExit("a server process did not start within 60 s")
    fork = multiprocessing.get_context("fork")
    before, started = Snapshot.take(), time.perf_counter()
    pipes, procs = [], []
    for p in range(args.client_procs):
        share = args.clients // args.client_procs + (p < args.clients % args.client_procs)
        parent, child = fork.Pipe(duplex=False)
        proc = fork.Process(target=_clients, args=(port, share, body, args.seconds, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    results = [pipe.recv() for pipe in pipes]
    for proc in procs:
        proc.join()
    processes = busiest(before, Snapshot.take(), time.perf_counter() - started, top=args.servers + 4, threads_of=0)
    for s in servers:
        s.terminate()
    done, wall = sum(r[0] for r in results), max(r[1] for r in results)
    server_pids = {s.pid for s in servers}
    row = {"servers": args.servers, "clients": args.clients, "client_procs": args.client_procs, "body_mb": args.mb,
           "seconds": round(wall, 2), "req_s": done / wall, "body_mb_s": done * size / wall / 1e6,
           "resnet18_uint8_img_s": done * size / RESNET18_PIXELS / wall,
           "server_cores": sum(p["cores"] for p in processes if p["pid"] in server_pids),
           "client_cores": sum(r[2] for r in results) / wall, "busiest_processes": processes}
    emit("http_ceiling", [row], ["servers", "clients", "client_procs", "body_mb", "req_s", "body_mb_s",
                                 "resnet18_uint8_img_s", "server_cores", "client_cores"], args.out)


if __name__ == "__main__":
    main()
