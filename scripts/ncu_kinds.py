#!/usr/bin/env python3
"""Per-kind table of an `ncu --csv` log of one decode step: kernels grouped by name and grid size
(so one kernel at different shapes, e.g. gemv_bulk_kernel as o_proj, down_proj and lm_head, stays
apart), with the mean time, the mean DRAM bytes read and their rate. Needs the metrics
gpu__time_duration.sum and dram__bytes_read.sum (the grid from ncu's Grid Size column or
launch__grid_size; optional:
launch__registers_per_thread, sm__warps_active.avg.pct_of_peak_sustained_active).
Usage: ncu_kinds.py NCU.csv"""
import collections
import csv
import re
import sys

import ncu_table  # beside this script: the kernel-name shortening

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}


def short(name):
    return ncu_table.short(name).replace("__nv_bfloat16", "bf16")[:64]


def main(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    if not rows:
        raise SystemExit("no ncu rows in " + path)
    ix = {h: i for i, h in enumerate(rows[0])}
    kernels = collections.OrderedDict()
    for r in rows[1:]:
        k = kernels.setdefault(r[ix["ID"]], {"name": short(r[ix["Kernel Name"]])})
        if "Grid Size" in ix:  # "(768, 1, 1)"
            dims = [int(d) for d in re.findall(r"\d+", r[ix["Grid Size"]])]
            if dims:
                k["grid"] = dims[0] * (dims[1] if len(dims) > 1 else 1) * (dims[2] if len(dims) > 2 else 1)
        value = float(r[ix["Metric Value"]].replace(",", "") or 0)
        k[r[ix["Metric Name"]]] = value * SCALE.get(r[ix["Metric Unit"]], 1.0)
    groups = collections.OrderedDict()
    for k in kernels.values():
        key = (k["name"], int(k.get("grid", k.get("launch__grid_size", 0))))
        groups.setdefault(key, []).append(k)
    span = sum(k.get("gpu__time_duration.sum", 0.0) for k in kernels.values())
    mb = sum(k.get("dram__bytes_read.sum", 0.0) for k in kernels.values())
    print(f"{len(kernels)} kernels, {span / 1e3:.3f} ms of kernel time, {mb / 1e3:.2f} GB read "
          f"({mb / span:.2f} TB/s over the kernel time)")
    print(f"| kernel | grid | regs | occ % | n | us each | MB each | TB/s | % of time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (name, grid), ks in sorted(groups.items(), key=lambda kv: -sum(k.get("gpu__time_duration.sum", 0) for k in kv[1])):
        us = sum(k.get("gpu__time_duration.sum", 0.0) for k in ks)
        mbs = sum(k.get("dram__bytes_read.sum", 0.0) for k in ks)
        regs = ks[0].get("launch__registers_per_thread", 0)
        occ = sum(k.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0.0) for k in ks) / len(ks)
        print(f"| {name} | {grid} | {regs:.0f} | {occ:.0f} | {len(ks)} | {us / len(ks):.2f} | {mbs / len(ks):.1f} | "
              f"{mbs / us if us else 0:.2f} | {100 * us / span:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
