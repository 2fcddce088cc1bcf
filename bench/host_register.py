"""What reading float32 images straight from pageable host memory costs, where the pages are locked in place
(``cudaHostRegister``) instead of staged into pinned rows by the CPU.

A stream over two H200s from a plain (pageable) float32 source is bound by the host's staging: each image is
read as float32, written as fp16 into pinned rows and read again by the GPU's copy, 1.2 MB of host memory
traffic, and the box stages at most about 0.73 of the two GPUs' run (BENCHMARKS.md 39, 42). Locking the
source's own pages leaves one read, the GPU's. This measures, on a fresh source in DRAM: locking and unlocking
pieces of it, the GPUs' copies from the locked pieces (one GPU, then every GPU at once, each from its own
part), and the same pieces staged by the CPU into fp16 pinned rows, the route a stream takes today.

    python -m bench.host_register --gib 4 --piece-images 256
"""

from __future__ import annotations

import argparse
import threading
import time

IMAGE_BYTES = 3 * 224 * 224 * 4
HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process


def _register(cudart, tensor) -> float:
    start = time.perf_counter()
    code = cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), HOST_REGISTER_PORTABLE)
    if int(code) != 0:
        raise SystemExit(f"cudaHostRegister failed: {code}")
    return time.perf_counter() - start


def _unregister(cudart, tensor) -> float:
    start = time.perf_counter()
    code = cudart.cudaHostUnregister(tensor.data_ptr())
    if int(code) != 0:
        raise SystemExit(f"cudaHostUnregister failed: {code}")
    return time.perf_counter() - start


def lane(gpu: int, pieces: list, register: bool, out: dict, barrier: threading.Barrier) -> None:
    """Copies ``pieces`` to GPU ``gpu``: each locked, copied and unlocked after its copy (``register``), or
    staged by this thread into an fp16 pinned row first; two device buffers by turns."""
    import torch

    cudart = torch.cuda.cudart()
    device = torch.device("cuda", gpu)
    stream = torch.cuda.Stream(device)
    rows = pieces[0].shape[0]
    dtype = torch.float32 if register else torch.float16
    dev = [torch.empty(pieces[0].shape, dtype=dtype, device=device) for _ in range(2)]
    pinned = None if register else [torch.empty(pieces[0].shape, dtype=torch.float16).pin_memory() for _ in range(2)]
    done = [torch.cuda.Event() for _ in range(2)]
    held: list = [None, None]
    lock_s = unlock_s = stage_s = 0.0
    barrier.wait()
    start = time.perf_counter()
    for i, piece in enumerate(pieces):
        slot = i % 2
        done[slot].synchronize()  # the copy two pieces back ended: its source may go
        if held[slot] is not None:
            unlock_s += _unregister(cudart, held[slot])
            held[slot] = None
        if register:
            lock_s += _register(cudart, piece)
            source = held[slot] = piece
        else:
            t = time.perf_counter()
            pinned[slot].copy_(piece)
            stage_s += time.perf_counter() - t
            source = pinned[slot]
        with torch.cuda.stream(stream):
            dev[slot].copy_(source, non_blocking=True)
            done[slot].record(stream)
    stream.synchronize()
    for slot in range(2):
        if held[slot] is not None:
            unlock_s += _unregister(cudart, held[slot])
    seconds = time.perf_counter() - start
    out[gpu] = {"images": rows * len(pieces), "s": seconds, "lock_s": lock_s, "unlock_s": unlock_s,
                "stage_s": stage_s}


def run(source, gpus: int, piece_images: int, register: bool) -> dict:
    import torch

    flat = torch.from_numpy(source)
    pieces = list(flat.split(piece_images))
    pieces = [p for p in pieces if p.shape[0] == piece_images]
    share = len(pieces) // gpus
    out: dict = {}
    barrier = threading.Barrier(gpus)
    threads = [threading.Thread(target=lane, args=(g, pieces[g * share:(g + 1) * share], register, out, barrier))
               for g in range(gpus)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    images = sum(v["images"] for v in out.values())
    return {"gpus": gpus, "route": "locked in place" if register else "staged fp16", "images": images,
            "img_s": images / wall, "GB_s": images * IMAGE_BYTES / wall / 1e9,
            "lock_ms_per_piece": 1e3 * sum(v["lock_s"] for v in out.values()) / max(1, len(pieces[:share * gpus])),
            "unlock_ms_per_piece": 1e3 * sum(v["unlock_s"] for v in out.values()) / max(1, len(pieces[:share * gpus])),
            "stage_ms_per_piece": 1e3 * sum(v["stage_s"] for v in out.values()) / max(1, len(pieces[:share * gpus]))}


def lock_in_parallel(source, threads: int) -> dict:
    """The whole source locked, then unlocked, as ``threads`` disjoint page-aligned parts at once, one
    thread each: whether locking pages scales with threads where one thread locks at 14-24 GB/s (a stream
    over two H200s would need about 90 GB/s of it)."""
    import torch

    cudart = torch.cuda.cudart()
    flat = torch.from_numpy(source).view(-1).view(torch.uint8)
    base, size = flat.data_ptr(), flat.numel()
    aligned = [-(-(base + k * size // threads) // 4096) * 4096 - base for k in range(1, threads)]
    edges = [0] + [min(size, a) for a in aligned] + [size]
    parts = [flat[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]
    walls = {}
    for name, fn in (("lock", _register), ("unlock", _unregister)):
        barrier = threading.Barrier(len(parts) + 1)
        workers = [threading.Thread(target=lambda p=p, b=barrier, f=fn: (b.wait(), f(cudart, p))) for p in parts]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        walls[name] = time.perf_counter() - start
    return {"threads": threads, "lock_GB_s": size / walls["lock"] / 1e9, "unlock_GB_s": size / walls["unlock"] / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="the source's size: fresh memory, in DRAM")
    parser.add_argument("--piece-images", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--lock-threads", default="",
                        help="only lock and unlock the whole source on each of these thread counts (1,4,8,16)")
    args = parser.parse_args()
    import torch

    images = int(args.gib * 2**30 // IMAGE_BYTES)
    gpus = torch.cuda.device_count()
    print(f"source {images} float32 224x224 images ({images * IMAGE_BYTES / 2**30:.1f} GiB), pieces of "
          f"{args.piece_images}, {gpus} GPU(s), {torch.get_num_threads()} torch threads", flush=True)
    for n in range(args.repeat):
        source = torch.empty((images, 3, 224, 224)).uniform_().numpy()  # fresh pages, written on every core
        if args.lock_threads:
            for threads in (int(t) for t in args.lock_threads.split(",")):
                r = lock_in_parallel(source, threads)
                print(f"round {n + 1} locked on {threads} threads at once: {r['lock_GB_s']:.1f} GB/s, unlocked "
                      f"{r['unlock_GB_s']:.1f} GB/s", flush=True)
            continue
        for g in sorted({1, gpus}):
            for register in (True, False):
                r = run(source, g, args.piece_images, register)
                print(f"round {n + 1} {r['gpus']} GPU(s) {r['route']:<16} {r['img_s']:>9.0f} img/s "
                      f"{r['GB_s']:>6.1f} GB/s  lock {r['lock_ms_per_piece']:.1f} ms/piece, unlock "
                      f"{r['unlock_ms_per_piece']:.1f}, staging {r['stage_ms_per_piece']:.1f}", flush=True)
        t = torch.from_numpy(source)
        whole = _register(torch.cuda.cudart(), t)
        whole_off = _unregister(torch.cuda.cudart(), t)
        print(f"round {n + 1} the whole source locked in {whole:.3f} s ({t.numel() * 4 / whole / 1e9:.0f} GB/s), "
              f"unlocked in {whole_off:.3f} s", flush=True)
        del source, t


if __name__ == "__main__":
    main()
