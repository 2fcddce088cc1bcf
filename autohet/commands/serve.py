"""``autohet serve``: an exported config behind HTTP (Ray Serve), until SIGINT or SIGTERM.

Bad input (a config that cannot load, a port in use, a bad flag) ends in one line and exit 2; a
signal drains the service (new requests 503, admitted ones answered), prints one line and exits
130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
import time

from autohet.core.errors import Interrupted

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an exported config over HTTP (Ray Serve): POST /v1/predict, "
                                            "GET /healthz, the Open Inference Protocol v2 (/v2, --grpc-port)")
    p.add_argument("--config", required=True, help="an exported config (runs/<experiment>/best.yaml)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                                                        "only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--address", help="join this Ray cluster (replicas go to the nodes the config's executors name)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0,
                   help="how long a replica waits for more requests to fill its batch (default 2)")
    p.add_argument("--max-queue", type=int, default=128,
                   help="requests admitted at once; more get 503 with Retry-After (default 128)")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MB (default 32)")
    p.add_argument("--drain-s", type=float, default=10.0,
                   help="on SIGINT/SIGTERM, seconds to wait for admitted requests (default 10)")
    p.add_argument("--request-timeout-s", type=float, default=60.0,
                   help="a request not answered within this gets 408 (default 60)")
    p.add_argument("--ingress-procs", type=int,
                   help="processes reading requests on the port (default: one per two cores the config leaves "
                        "free, 1-8); --max-queue is shared between them")
    p.add_argument("--grpc-port", type=int,
                   help="also serve the Open Inference Protocol's gRPC service on this port (Triton's is 8001; "
                        "default: not served)")
    p.add_argument("--name", help="the model's name in the Open Inference Protocol (default: the config's model)")
    p.add_argument("--input-datatype", default="FP32", type=str.upper,
                   help="the input's datatype in the protocol's metadata: FP32 (model inputs) or UINT8 (pixels, scaled "
                        "by the config's preprocess); both are taken either way (default FP32)")
    p.add_argument("--metrics-port", type=int,
                   help="port of Ray's Prometheus metrics on this node (default: Ray's choice, printed at start)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from autohet.service import Service, ServiceOptions

    service = Service(ServiceOptions(
        config=args.config, host=args.host, port=args.port, address=args.address, batch_wait_ms=args.batch_wait_ms,
        max_queue=args.max_queue, max_body_mb=args.max_body_mb, drain_s=args.drain_s,
        request_timeout_s=args.request_timeout_s, metrics_port=args.metrics_port, ingress_procs=args.ingress_procs,
        grpc_port=args.grpc_port, name=args.name, input_datatype=args.input_datatype))
    try:
        try:
            service.start()
            for line in service.describe():
                print(line, flush=True)
            while True:
                time.sleep(3600)
        except Interrupted as exc:
            if service.ingress is None:  # still starting: nothing admitted yet, the CLI's own line
                raise
            signum = exc.signum
        first, left, seconds = service.drain()
        service.close()
        unanswered = f", {left} not answered within --drain-s" if left else ""
        print(f"autohet: {'terminated' if signum == 15 else 'interrupted'}: drained {first} request"
              f"{'' if first == 1 else 's'} in flight in {seconds:.1f} s{unanswered}; service stopped",
              file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        service.close()
