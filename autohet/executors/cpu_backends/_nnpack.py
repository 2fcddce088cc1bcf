"""ONNX Runtime with NNPACK's Winograd convolutions for the wide 3x3 layers where they measure faster.

ONNX Runtime's CPU kernels compute a 3x3 convolution directly; NNPACK (built into PyTorch's CPU
wheel) computes it by Winograd's transform, with fewer multiplications, which pays where the layer
is wide enough for the transforms to be cheap next to the products; a narrow layer is slower in
NNPACK, and a model may have no layer it wins (docs/why.md, executors/cpu_backends/_nnpack.py). So
the program is the model cut around its candidate layers, each candidate timed both ways on the
executor's own cores at its batch, and the layers NNPACK won run as PyTorch modules between ONNX
Runtime sessions of the rest.

Candidates: 3x3 convolutions of stride 1 and dilation 1, one group, at least ``MIN_CHANNELS`` in and
out, that can be cut out of the model with one tensor crossing either side (a layer inside a
residual block cannot). The choice is cached per (model, shape, batch, threads, CPU, versions) beside
the converted models. NNPACK keeps one thread pool per process, made at its first call with that
call's thread count and cores: an executor whose group differs from the first one's in the process
runs ONNX Runtime alone, and ``describe`` says so.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import fx, nn

from autohet.executors.cpu_backends._base import CpuBackend, CpuProgram, ModelSource
from autohet.executors.cpu_backends._cache import converted
from autohet.executors.cpu_backends._onnxruntime import OnnxRuntimeBackend, export_onnx, in_batches, ort_session

if TYPE_CHECKING:
    from autohet.executors.base import ExecutorSpec
    from autohet.partition import Block

__all__ = ["MIN_CHANNELS", "NnpackBackend", "NnpackConv2d", "SegmentedProgram", "candidate_cuts", "nnpack_module"]

# the narrowest layer NNPACK is tried on: vgg16's 128-channel stage lost to ONNX Runtime, its 256- and
# 512-channel stages tied or won (docs/why.md, executors/cpu_backends/_nnpack.py)
MIN_CHANNELS = 256
_TIMED_RUNS = 3  # per candidate and side, after one untimed call; the best of them is compared

_POOL_LOCK = threading.Lock()
_POOL_OWNER: tuple[int, tuple[int, ...]] | None = None  # the (threads, cores) NNPACK's pool here was made for


class NnpackConv2d(nn.Module):
    """A convolution computed by NNPACK with the layer's own weights."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        # initialises NNPACK: until something asks, every call fails ("SpatialConvolution_updateOutput failed")
        if not torch._nnpack_available():
            raise RuntimeError("NNPACK did not initialise on this CPU")
        self.weight = conv.weight
        self.bias = conv.bias
        self.padding, self.stride = tuple(conv.padding), tuple(conv.stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._nnpack_spatial_convolution(x.contiguous(), self.weight, self.bias, self.padding, self.stride)


def is_candidate(module: Any) -> bool:
    """A convolution NNPACK's Winograd path computes and that is wide enough to be worth timing."""
    return (isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (3, 3) and tuple(module.stride) == (1, 1)
            and tuple(module.dilation) == (1, 1) and module.groups == 1 and module.padding_mode == "zeros"
            and not isinstance(module.padding, str) and min(module.in_channels, module.out_channels) >= MIN_CHANNELS)


def candidate_cuts(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """For each candidate convolution of a traced model, the two fx nodes to cut after (the one before
    it, and it or the activations that follow it alone) where one tensor crosses each cut."""
    from autohet.partition._ops import is_activation

    nodes = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    out = []
    for k, node in enumerate(nodes):
        if k == 0 or node.op != "call_module" or not is_candidate(gm.get_submodule(str(node.target))):
            continue
        j = k
        while (j + 1 < len(nodes) and list(nodes[j].users) == [nodes[j + 1]]
               and nodes[j + 1].all_input_nodes == [nodes[j]] and is_activation(gm, nodes[j + 1])):
            j += 1
        before = nodes[k - 1]
        inside = set(nodes[k:j + 1])
        read_after = {a for n in nodes[j + 1:] for a in n.all_input_nodes} | set(_output_reads(gm))
        earlier = set(nodes[:k]) | {n for n in gm.graph.nodes if n.op == "placeholder"}
        if node.all_input_nodes != [before] or list(before.users) != [node]:
            continue  # the value before the convolution is read elsewhere too (a branch, a residual)
        if read_after & earlier or read_after & inside != {nodes[j]}:
            continue  # something from before the layer, or from inside it, is read after it
        out.append((before.name, nodes[j].name))
    return out


def _output_reads(gm: fx.GraphModule) -> list[fx.Node]:
    return [a for n in gm.graph.nodes if n.op == "output" for a in n.all_input_nodes]


def nnpack_module(block: Block) -> nn.Module:
    """The block's module with its candidate convolutions computed by NNPACK (the model's weights shared)."""
    gm = fx.GraphModule(block.module, copy.deepcopy(block.module.graph))
    for node in gm.graph.nodes:
        if node.op == "call_module" and is_candidate(gm.get_submodule(str(node.target))):
            name = "nnpack_" + str(node.target).replace(".", "_")
            gm.add_submodule(name, NnpackConv2d(gm.get_submodule(str(node.target))))
            node.target = name
    gm.recompile()
    return gm.eval()


class SegmentedProgram(CpuProgram):
    """The model as a chain of steps, ONNX Runtime sessions and PyTorch modules whose convolutions
    NNPACK computes; values cross between them as the same memory (numpy and torch share it)."""

    def __init__(self, steps: list[tuple[str, Any]], layers: list[str], note: str = "") -> None:
        self.steps, self.layers, self.note = steps, layers, note
        self._feeds = [s.get_inputs()[0].name if k == "onnxruntime" else "" for k, s in steps]

    def _chunk(self, x: np.ndarray) -> np.ndarray:
        for (kind, step), feed in zip(self.steps, self._feeds, strict=True):
            if kind == "onnxruntime":
                x = step.run(None, {feed: x})[0]
            else:
                with torch.inference_mode():
                    x = step(torch.from_numpy(x)).numpy()
        return x

    def run(self, x: np.ndarray, batch: int) -> np.ndarray:
        return in_batches(self._chunk, x, batch)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nnpack_layers": list(self.layers), "nnpack_steps": [k for k, _ in self.steps]}
        if self.note:
            out["nnpack_note"] = self.note
        return out


def _claim_pool(threads: int, cores: tuple[int, ...]) -> str:
    """Claims NNPACK's process-wide pool for ``(threads, cores)``: '' where it is (or was) this group's,
    else why not."""
    global _POOL_OWNER
    with _POOL_LOCK:
        if _POOL_OWNER is None:
            _POOL_OWNER = (threads, cores)
        if (threads, cores) != _POOL_OWNER:
            return (f"NNPACK's pool in this process runs {_POOL_OWNER[0]} threads on cores {list(_POOL_OWNER[1])}: "
                    "ONNX Runtime alone here")
    return ""


def _best_seconds(fn: Any) -> float:
    fn()
    best = float("inf")
    for _ in range(_TIMED_RUNS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _chain(traced: tuple[fx.GraphModule, str], shape: tuple[int, ...], name: str,
           cuts: list[str]) -> list[Block]:
    """The traced model's blocks cut after ``cuts`` (fx node names), each reading the one before it
    alone (``traced``: ``partition.trace``'s graph and tracer, traced once per build)."""
    from autohet.partition import build_blocks

    graph = build_blocks(traced[0], name, 1, shape, traced[1], cuts=sorted(set(cuts), key=cuts.index))
    previous = graph.input_name
    for block in graph.blocks:
        if block.inputs != [previous] or len(block.outputs) != 1:
            raise RuntimeError(f"block {block.name} of the cut model does not read the block before it alone")
        previous = block.outputs[0]
    return graph.blocks


class NnpackBackend(CpuBackend):
    name = "onnxruntime_nnpack"
    precisions = ("fp32",)
    warm_full_batch = True

    def missing(self) -> str | None:
        if not torch.backends.nnpack.is_available():
            return "this PyTorch build has no NNPACK (use onnxruntime)"
        return OnnxRuntimeBackend().missing()

    def variant_key(self, spec: ExecutorSpec) -> tuple:
        return (self.name, spec.precision, spec.batch)  # the layers are chosen by timing at the batch

    def build(self, source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...]) -> CpuProgram:
        from autohet.partition import trace

        started = time.perf_counter()
        traced = trace(source.module().eval(), torch.zeros((1, *shape)))  # shapes only: one image
        cuts = candidate_cuts(traced[0])
        threads = max(1, len(spec.cores))
        note = _claim_pool(threads, tuple(spec.cores)) if cuts else "no candidate layer"
        chosen = _choose(source, spec, shape, traced, cuts, threads) if cuts and not note else []
        steps = _steps(source, spec, shape, traced, chosen)
        program = SegmentedProgram(steps, [after for _, after in chosen], note)
        program.compile_s = time.perf_counter() - started
        return program


def _block_session(source: ModelSource, block: Block, spec: ExecutorSpec) -> Any:
    shape = tuple(block.in_shapes[0][1:])
    tool = f"torch-{torch.__version__}-block-{block.inputs[0]}..{block.outputs[0]}"
    path = converted("onnx", source, shape, tool, (".onnx",),
                     lambda p: export_onnx(block.module, shape, p, legacy_first=True))
    return ort_session(path, spec.cores)


def _choose(source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...], traced: tuple[fx.GraphModule, str],
            cuts: list[tuple[str, str]], threads: int) -> list[tuple[str, str]]:
    """The candidates NNPACK computes faster than ONNX Runtime on this group at its batch (cached)."""
    import onnxruntime

    from autohet.executors.machine import compile_cache_dir
    from autohet.platform.fingerprint import cpu_model

    ident = {"model": source.spec.name, "seed": source.spec.seed, "checkpoint": source.spec.checkpoint,
             "shape": list(shape), "batch": spec.batch, "threads": threads, "cpu": cpu_model(),
             "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "cuts": cuts}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    cache = compile_cache_dir() / "nnpack" / f"{source.spec.name.replace(':', '_')}-{digest}.json"
    if cache.is_file():
        return [(a, b) for a, b in json.loads(cache.read_text())["chosen"]]
    blocks = _chain(traced, shape, source.spec.name, [c for pair in cuts for c in pair])
    generator = torch.Generator().manual_seed(0)
    chosen, timings = [], {}
    with torch.inference_mode():
        for block in blocks:
            pair = next(((a, b) for a, b in cuts if block.inputs == [a] and block.outputs == [b]), None)
            if pair is None:
                continue
            # random images of the layer's input shape: a dense convolution's time does not depend on the values
            x = torch.randn((spec.batch, *block.in_shapes[0][1:]), generator=generator)
            fast, session = nnpack_module(block), _block_session(source, block, spec)
            feed = {session.get_inputs()[0].name: x.numpy()}
            t_nnpack = _best_seconds(lambda fast=fast, x=x: fast(x))
            t_ort = _best_seconds(lambda session=session, feed=feed: session.run(None, feed))
            timings[pair[1]] = {"nnpack_s": round(t_nnpack, 5), "onnxruntime_s": round(t_ort, 5)}
            if t_nnpack < t_ort:
                chosen.append(pair)
    cache.parent.mkdir(parents=True, exist_ok=True)  # a scratch file of its own: groups of one size time at once
    with tempfile.NamedTemporaryFile("w", dir=cache.parent, suffix=".tmp", delete=False) as scratch:
        scratch.write(json.dumps({"ident": ident, "chosen": chosen, "timings": timings}, indent=1))
    os.replace(scratch.name, cache)
    return chosen


def _steps(source: ModelSource, spec: ExecutorSpec, shape: tuple[int, ...], traced: tuple[fx.GraphModule, str],
           chosen: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """The model cut around the chosen layers: an NNPACK module per chosen layer, a session per run of
    the rest (one session for the whole model where none was chosen)."""
    if not chosen:
        return [("onnxruntime", OnnxRuntimeBackend().build(source, spec, shape).session)]
    blocks = _chain(traced, shape, source.spec.name, [c for pair in chosen for c in pair])
    steps: list[tuple[str, Any]] = []
    for block in blocks:
        if any(block.inputs == [a] and block.outputs == [b] for a, b in chosen):
            steps.append(("nnpack", nnpack_module(block)))
        else:
            steps.append(("onnxruntime", _block_session(source, block, spec)))
    return steps
