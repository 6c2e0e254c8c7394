#!/usr/bin/env python3
"""Per-kernel table of an `ncu --csv` log (gpu__time_duration.sum, dram__bytes_read.sum):
kernels grouped by name, sorted by total time, with the share of the profiled span.
Usage: ncu_table.py NCU.csv   (scripts/cuda_device_run.sh profile writes such logs)."""
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"xserv::cuda::(\(anonymous namespace\)::)?", "", name)
    name = re.sub(r"\(.*\)$", "", name)  # parameter list
    return name[:70]


def main(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    if not rows:
        raise SystemExit("no ncu rows in " + path)
    ix = {h: i for i, h in enumerate(rows[0])}
    kernels = collections.OrderedDict()
    for r in rows[1:]:
        k = kernels.setdefault(r[ix["ID"]], {"name": short(r[ix["Kernel Name"]])})
        value = float(r[ix["Metric Value"]].replace(",", "") or 0)
        unit = r[ix["Metric Unit"]]
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "nsecond": 1e-3,
                 "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "KB": 1e-6, "MB": 1e-3, "GB": 1.0}
        k[r[ix["Metric Name"]]] = value * scale.get(unit, 1.0)
    total = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in kernels.values():
        t = total[k["name"]]
        t[0] += 1
        t[1] += k.get("gpu__time_duration.sum", 0.0)
        t[2] += k.get("dram__bytes_read.sum", 0.0)
    span = sum(t[1] for t in total.values())
    print(f"{len(kernels)} kernels, {span / 1e3:.3f} ms of kernel time")
    print(f"{'kernel':70s} {'n':>4s} {'us':>9s} {'%':>5s} {'GB read':>8s} {'TB/s':>5s}")
    for name, (n, us, gb) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:70s} {n:4d} {us:9.1f} {100 * us / span:5.1f} {gb:8.3f} {gb / us * 1e3 if us else 0:5.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
