#!/usr/bin/env python3
"""Per-step kernel tables of an `ncu --csv` log holding several profiled decode steps
(gpu__time_duration.sum, dram__bytes_read.sum; XSERV_CUDA_PROFILE_REPLAY ranges, e.g. one
step per batch size of `generate_bench --batch 16,64,128`). A step starts at each embedding
kernel (the first kernel of every forward); its rows are the embedding's grid (one block a row).
For each step: kernels grouped by name (and grid, so GEMMs of different shapes stay apart),
sorted by time, and the kernels of its first layer in launch order.
Usage: ncu_steps.py NCU.csv [LAYER_KERNELS]   (scripts/cuda_device_run.sh serveprof)."""
import collections
import csv
import re
import sys

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "KB": 1e-6, "MB": 1e-3, "GB": 1.0}


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"xserv::(cuda::)?(\(anonymous namespace\)::|<unnamed>::)?", "", name)
    name = re.sub(r"\(.*\)$", "", name)  # parameter list
    name = re.sub(r"<.*>$", "", name) if len(name) > 56 else name
    return name[:56]


def load(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    if not rows:
        raise SystemExit("no ncu rows in " + path)
    ix = {h: i for i, h in enumerate(rows[0])}
    kernels = collections.OrderedDict()
    for r in rows[1:]:
        k = kernels.setdefault(r[ix["ID"]], {"name": short(r[ix["Kernel Name"]]),
                                              "grid": r[ix["Grid Size"]].replace(" ", ""),
                                              "block": r[ix["Block Size"]].replace(" ", "")})
        value = float(r[ix["Metric Value"]].replace(",", "") or 0)
        k[r[ix["Metric Name"]]] = value * SCALE.get(r[ix["Metric Unit"]], 1.0)
    return list(kernels.values())


def main(path, layer_kernels):
    ks = load(path)
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("embedding")]
    if not starts:
        starts = [0]
    starts.append(len(ks))
    for a, b in zip(starts[:-1], starts[1:]):
        step = ks[a:b]
        rows = step[0]["grid"].strip("()").split(",")[0]
        span = sum(k.get("gpu__time_duration.sum", 0.0) for k in step)
        gb_all = sum(k.get("dram__bytes_read.sum", 0.0) for k in step)
        print(f"\n=== step of {rows} rows: {len(step)} kernels, {span:.1f} us of kernel time, "
              f"{gb_all:.3f} GB read")
        total = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for k in step:
            t = total[(k["name"], k["grid"])]
            t[0] += 1
            t[1] += k.get("gpu__time_duration.sum", 0.0)
            t[2] += k.get("dram__bytes_read.sum", 0.0)
        print(f"{'kernel':56s} {'grid':>14s} {'n':>4s} {'us':>8s} {'us each':>8s} {'%':>5s} {'GB':>7s} {'TB/s':>5s}")
        for (name, grid), (n, us, gb) in sorted(total.items(), key=lambda kv: -kv[1][1]):
            if us < 0.005 * span:
                continue
            print(f"{name:56s} {grid:>14s} {n:4d} {us:8.1f} {us / n:8.2f} {100 * us / span:5.1f} "
                  f"{gb:7.3f} {gb / us * 1e3 if us else 0:5.2f}")
        print(f"-- first {layer_kernels} kernels in launch order")
        for k in step[:layer_kernels]:
            us = k.get("gpu__time_duration.sum", 0.0)
            gb = k.get("dram__bytes_read.sum", 0.0)
            print(f"   {k['name']:56s} {k['grid']:>14s} {k['block']:>12s} {us:8.2f} us {1e3 * gb:8.2f} MB "
                  f"{gb / us * 1e3 if us else 0:5.2f} TB/s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16)
