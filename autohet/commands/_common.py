"""Pieces the subcommands share: model/pool/workload options and building them."""

from __future__ import annotations

import argparse
from typing import Any

from autohet.core.errors import UserError
from autohet.core.models import ModelSpec, input_shape
from autohet.pool import LocalPool, Pool, PoolSpec, RayPool, check_local_devices

__all__ = ["add_model_args", "add_pool_args", "add_workload_args", "make_pool", "model_spec", "require_positive",
           "summary_table", "table"]


def add_model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--model", required=required,
                        help="lenet, cifarnet, any torchvision classifier (vgg16, resnet18, ...) "
                             "or package.module:factory")
    parser.add_argument("--weights-seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--checkpoint", help="a .pt state dict to load instead of random weights")


def add_pool_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", default="actors/auto.yaml",
                        help="pool file (actors/*.yaml); default actors/auto.yaml detects this machine")
    parser.add_argument("--address", help="join this Ray cluster instead of starting a local Ray")
    parser.add_argument("--in-process", action="store_true",
                        help="run executors as threads in this process, without Ray (debugging)")


def add_workload_args(parser: argparse.ArgumentParser, default_images: int = 10000) -> None:
    parser.add_argument("--images", type=int, default=None,
                        help=f"number of images (default {default_images}, or the config's)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic images")
    parser.add_argument("--npy", help="an .npy file of N images instead of synthetic ones")
    parser.add_argument("--check-images", type=int, default=64,
                        help="images compared against the single-device reference")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    spec = ModelSpec(args.model, args.weights_seed, args.checkpoint)
    input_shape(spec.name)  # validates the name early
    if spec.checkpoint:
        from autohet.core.models import check_checkpoint

        check_checkpoint(spec)  # a bad file fails here, in one line, not inside an executor
    return spec


def make_pool(spec: PoolSpec, address: str | None, in_process: bool = False,
              name_prefix: str | None = None) -> Pool:
    if in_process:
        check_local_devices(spec)
        return LocalPool(spec)
    from autohet.platform.ray_cluster import init_ray

    init_ray(address)
    return RayPool(spec, name_prefix)


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]], best_label: str) -> str:
    """Per strategy: trials, how each ended (ok, invalid outputs, cut, refused, ...), best and efficiency."""
    from autohet.tracking import STATUSES

    shown = [s for s in STATUSES if s != "killed" and any(r.get(s) for r in rows)] or ["ok"]
    killed = any(r.get("killed") for r in rows)
    cols = shown + (["killed"] if killed else [])
    return table([[r["strategy"], r["trials"], *[r.get(s, 0) for s in cols], "-" if r["best"] is None else r["best"],
                   "-" if r["efficiency"] is None else r["efficiency"]] for r in rows],
                 ["strategy", "trials", *cols, best_label, "efficiency"])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def require_positive(name: str, value: int) -> None:
    if value < 1:
        raise UserError(f"{name} must be at least 1, got {value}")
