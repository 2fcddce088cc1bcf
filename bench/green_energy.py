"""Images per joule against the SMs a model may use (issue 15): does a smaller GPU trade speed for energy?

One process, no Ray. The model runs alone on the whole GPU, then on one green-context partition of
``n`` SMs (the rest of the GPU idle), each for ``--seconds`` of a plain device-resident loop. NVML's
total-energy counter is differenced over each run (the whole board: idle SMs, memory and fans
included, which is what a user pays for). Rows: SMs granted, img/s, average W, J/img, SM clock.

    python -m bench.green_energy --sms 96,64,32,16,8      # GPU box
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from autohet.core.models import build_model, input_shape
from autohet.executors.green import sm_partitions
from autohet.platform.sensors import nvml_module


def measured(model: Any, x: torch.Tensor, stream: Any, seconds: float, handle: Any, nv: Any) -> dict[str, float]:
    """img/s, W and J/img of ``model(x)`` on ``stream`` over at least ``seconds`` (and one energy step)."""
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(5):
            model(x)
        stream.synchronize()
        clocks: list[float] = []
        e0, t0, done = nv.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                model(x)
            stream.synchronize()
            done += 8 * x.shape[0]
            clocks.append(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        wall = time.perf_counter() - t0
        joules = (nv.nvmlDeviceGetTotalEnergyConsumption(handle) - e0) / 1e3
    return {"ips": round(done / wall, 1), "watts": round(joules / wall, 1), "j_per_img": joules / done,
            "sm_mhz": round(sum(clocks) / len(clocks)), "temp_c": nv.nvmlDeviceGetTemperature(handle, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--sms", default="96,64,32,16,8", help="partition sizes to try after the whole GPU")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    nv = nvml_module()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.precision]
    model = build_model(args.model).to(dev, dtype).to(memory_format=torch.channels_last).eval()
    x = torch.randn((args.batch, *input_shape(args.model)), device=dev, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    idle_e0, t0 = nv.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter()
    time.sleep(2.0)
    idle_w = (nv.nvmlDeviceGetTotalEnergyConsumption(handle) - idle_e0) / 1e3 / (time.perf_counter() - t0)
    rows: list[dict[str, Any]] = [{"what": "idle", "watts": round(idle_w, 1)}]
    print(json.dumps(rows[-1]), flush=True)
    whole = {"what": "whole", "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
             **measured(model, x, torch.cuda.Stream(dev), args.seconds, handle, nv)}
    rows.append(whole)
    print(json.dumps(whole), flush=True)
    for n in (int(v) for v in args.sms.split(",") if v):
        part = sm_partitions(0, [n])[0]
        row = {"what": f"partition {n}", "sms": part.sms, **measured(model, x, part.stream, args.seconds, handle, nv)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'what':<16}{'SMs':>5}{'img/s':>10}{'W':>8}{'J/img':>10}{'vs whole ips':>14}{'vs whole J/img':>16}"
          f"{'MHz':>7}")
    for r in rows[1:]:
        print(f"{r['what']:<16}{r['sms']:>5}{r['ips']:>10.0f}{r['watts']:>8.1f}{r['j_per_img']:>10.5f}"
              f"{r['ips'] / whole['ips']:>14.3f}{r['j_per_img'] / whole['j_per_img']:>16.3f}{r['sm_mhz']:>7}")
    print(json.dumps({"model": args.model, "batch": args.batch, "precision": args.precision, "rows": rows}))


if __name__ == "__main__":
    main()
