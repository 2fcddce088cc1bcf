"""``autohet ui``: the MLflow UI on 127.0.0.1 for the default store under runs/."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ui", help="start the MLflow UI on 127.0.0.1 for the default store")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--tracking-uri", help="backend store URI (default: sqlite under runs/)")
    p.add_argument("--print-command", action="store_true", help="print the command instead of running it")
    p.set_defaults(func=main)


def command(args: argparse.Namespace) -> list[str]:
    from autohet.tracking import default_tracking_uri

    root = (Path("runs") / "mlartifacts").resolve()
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", args.tracking_uri or default_tracking_uri(),
            "--default-artifact-root", root.as_uri(), "--host", "127.0.0.1", "--port", str(args.port)]


def main(args: argparse.Namespace) -> int:
    cmd = command(args)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    print(f"MLflow UI on http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaces this process
