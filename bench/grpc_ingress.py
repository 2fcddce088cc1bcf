"""What reading a ModelInfer request costs an ingress process: the message parsed whole by protobuf
against ``read_infer_request`` (the tensors left in the wire bytes), and the freed messages kept in the
heap (``platform.memory.keep_large_blocks``) or not, side by side in one run.

A gRPC server with one ModelInfer method runs in a process of its own, in one of three modes by turns:
``protobuf`` (the request deserialised by protobuf, its tensor read from ``raw_input_contents``),
``walk`` (the wire bytes through ``autohet.service.oip_grpc.read_infer_request``) and ``walk+heap`` (the
walk, large blocks kept in the heap as the ingress keeps them); each time the tensor is then copied once,
as the ingress copies it into shared memory, and the answer is FP32 logits.
``tritonclient.grpc.aio`` clients in another process send ``--images`` uint8 224x224 images per request
for ``--seconds``. Printed per round: requests, the server process's CPU milliseconds per request and
its MB of tensor per CPU second; then each mode's median and their ratio.

    python -m bench.grpc_ingress --rounds 4 --images 64
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time

import numpy as np

SERVICE = "inference.GRPCInferenceService"
PIXELS = 3 * 224 * 224


def _serve(mode: str, port: int, images: int, options: tuple[tuple[str, int], ...] = ()) -> None:
    import grpc

    from autohet.platform.memory import keep_large_blocks
    from autohet.service import oip_messages_pb2 as pb
    from autohet.service.oip_grpc import read_infer_request

    if mode == "walk+heap" and not keep_large_blocks(1 << 30):
        raise SystemExit("walk+heap: this libc has no mallopt (glibc only)")

    logits = np.zeros((images, 1000), "<f4").tobytes()

    async def infer(request, context):
        if mode.startswith("walk"):
            data = read_infer_request(request)[1][0]
        else:
            data = request.raw_input_contents[0]
        landing = bytearray(len(data))
        landing[:] = data  # the one copy the ingress makes (into shared memory)
        tensor = pb.ModelInferResponse.InferOutputTensor(name="logits", datatype="FP32", shape=[images, 1000])
        return pb.ModelInferResponse(model_name="m", outputs=[tensor], raw_output_contents=[logits])

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30), *options])
        deserializer = None if mode.startswith("walk") else pb.ModelInferRequest.FromString
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                infer, request_deserializer=deserializer, response_serializer=lambda m: m.SerializeToString())}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def _load(port: int, images: int, clients: int, seconds: float, done: multiprocessing.Queue) -> None:
    import tritonclient.grpc.aio as tc

    async def main() -> int:
        client = tc.InferenceServerClient(f"127.0.0.1:{port}")
        x = np.random.default_rng(0).integers(0, 256, (images, 3, 224, 224), dtype=np.uint8)
        end, sent = time.monotonic() + seconds, 0

        async def one() -> None:
            nonlocal sent
            while time.monotonic() < end:
                tensor = tc.InferInput("input", list(x.shape), "UINT8")
                tensor.set_data_from_numpy(x)
                await client.infer("m", [tensor], outputs=[tc.InferRequestedOutput("logits")])
                sent += 1

        await asyncio.gather(*[one() for _ in range(clients)])
        await client.close()
        return sent

    done.put(asyncio.run(main()))


def _wait_listening(port: int, server: multiprocessing.Process, timeout_s: float = 60.0) -> None:
    """Until the server's port takes connections (its imports take seconds on a busy 2-core box)."""
    import socket

    end = time.monotonic() + timeout_s
    while time.monotonic() < end and server.is_alive():
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"the gRPC server did not listen on port {port} within {timeout_s:g} s "
                     f"(alive: {server.is_alive()})")


def one_round(mode: str, args: argparse.Namespace, port: int) -> dict[str, float]:
    import psutil

    context = multiprocessing.get_context("spawn")
    options = tuple(args.options) if mode == "walk+options" else ()
    server = context.Process(target=_serve, args=(mode, port, args.images, options), daemon=True)
    server.start()
    _wait_listening(port, server)
    try:
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        done: multiprocessing.Queue = context.Queue()
        client = context.Process(target=_load, args=(port, args.images, args.clients, args.seconds, done))
        client.start()
        requests = done.get(timeout=args.seconds + 60)
        client.join()
        after = process.cpu_times()
    finally:
        server.kill()
        server.join()
    cpu = (after.user + after.system) - (before.user + before.system)
    megabytes = requests * args.images * PIXELS / 1e6
    return {"requests": requests, "ms_per_request": 1000 * cpu / max(requests, 1), "mb_per_cpu_s": megabytes / cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--images", type=int, default=64, help="uint8 224x224 images per request")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--port", type=int, default=0, help="the first round's port (default: a free one each round)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                        help="a gRPC server channel argument: adds a fourth mode, walk+options, the walk with them")
    args = parser.parse_args()
    from bench.serve_load import free_port

    args.options = [(name, int(value)) for name, value in (o.split("=", 1) for o in args.option)]
    rows: dict[str, list[dict[str, float]]] = {"protobuf": [], "walk": [], "walk+heap": []}
    if args.options:
        rows["walk+options"] = []
    for k in range(args.rounds):
        for mode in rows:
            port = args.port + len(rows) * k + list(rows).index(mode) if args.port else free_port()
            row = one_round(mode, args, port)
            rows[mode].append(row)
            print(f"round {k + 1} {mode:12s} {row['requests']:5d} requests  {row['ms_per_request']:6.2f} ms CPU "
                  f"per request  {row['mb_per_cpu_s']:5.0f} MB per CPU s", flush=True)
    medians = {mode: statistics.median(r["ms_per_request"] for r in got) for mode, got in rows.items()}
    print(f"median server CPU per {args.images}-image request: protobuf {medians['protobuf']:.2f} ms, walk "
          f"{medians['walk']:.2f} ms: walk / protobuf {medians['walk'] / medians['protobuf']:.3f}; walk+heap "
          f"{medians['walk+heap']:.2f} ms: / walk {medians['walk+heap'] / medians['walk']:.3f}")
    if args.options:
        print(f"walk with {args.options}: {medians['walk+options']:.2f} ms: / walk "
              f"{medians['walk+options'] / medians['walk']:.3f}")


if __name__ == "__main__":
    main()
