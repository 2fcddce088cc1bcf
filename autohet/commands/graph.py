"""``autohet graph``: the model's blocks with their FLOPs, parameters and output sizes."""

from __future__ import annotations

import argparse

__all__ = ["register", "handler"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``graph`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "graph", help="cut a model into blocks at key operators and print them",
        description="Cuts the model after pooling, concatenation and residual joins (one tensor per "
                    "cut) and prints per block its operators, FLOPs (2 x conv/linear MACs), parameters "
                    "and output shape and bytes.")
    parser.add_argument("--model", required=True, help="lenet, cifarnet, a torchvision name, or pkg.mod:factory")
    parser.add_argument("--batch", type=int, default=1, help="images per input (FLOPs and bytes scale with it)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    parser.add_argument("--branches", action="store_true",
                        help="also split inception modules / down-sampling blocks into parallel branches")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=handler)
    return parser


def handler(args: argparse.Namespace) -> int:
    from autohet.partition import partition

    graph = partition(args.model, batch=args.batch, seed=args.seed, branches=args.branches)
    print(graph.to_json() if args.json else graph.to_table())
    return 0
