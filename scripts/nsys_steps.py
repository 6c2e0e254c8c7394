#!/usr/bin/env python3
"""Decode-step anatomy from an nsys GPU trace (`nsys stats --report cuda_gpu_trace --format csv`,
recorded with --cuda-graph-trace=node so the kernels inside graph replays are listed).
A step starts at each embedding kernel (the first kernel of every forward). For the last N
decode steps: period (embedding to embedding), kernel time, GPU idle (period - busy), kernel count,
idle inside the forward (gaps between its kernels) and outside it (sampling, token copy, host),
and the mean time per kernel name.
Usage: nsys_steps.py TRACE.csv [N]"""
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"xserv::cuda::(\(anonymous namespace\)::)?", "", name)
    name = re.sub(r"\(.*\)$", "", name)
    return name[:60]


def main(path, n):
    rows = list(csv.reader(open(path, errors="replace")))
    hdr = next(i for i, r in enumerate(rows) if any("Start" in c for c in r))
    h = rows[hdr]
    col = lambda key: next(i for i, c in enumerate(h) if key in c)
    s_i, d_i, n_i = col("Start"), col("Duration"), col("Name")
    ev = []
    for r in rows[hdr + 1:]:
        if len(r) <= max(s_i, d_i, n_i) or not r[s_i].strip():
            continue
        ev.append((float(r[s_i]), float(r[d_i]), r[n_i]))
    ev.sort()
    starts = [i for i, e in enumerate(ev) if "embedding" in e[2]]
    if len(starts) < 3:
        raise SystemExit(f"{len(starts)} embedding kernels in {path}")
    steps = list(zip(starts[:-1], starts[1:]))[-n:]
    per = collections.defaultdict(lambda: [0, 0.0])
    tot = collections.Counter()
    for a, b in steps:
        seg = ev[a:b]
        period = ev[b][0] - ev[a][0]
        busy = sum(d for _, d, _ in seg)
        kern = [e for e in seg if not e[2].startswith("[CUDA")]
        # the forward ends before the sampling inputs' copy or the first sampling kernel
        f_end = next((i for i, e in enumerate(seg) if e[2].startswith("[CUDA") or "topk" in e[2]
                      or "sample" in e[2]), len(seg))
        fwd = seg[:f_end]
        fwd_span = fwd[-1][0] + fwd[-1][1] - fwd[0][0]
        fwd_busy = sum(d for _, d, _ in fwd)
        tot.update(period=period, busy=busy, kernels=len(kern), fwd_kernels=len(fwd),
                   fwd_span=fwd_span, fwd_busy=fwd_busy)
        for s, d, nm in seg:
            p = per[short(nm)]
            p[0] += 1
            p[1] += d
    k = len(steps)
    us = lambda v: v / k / 1e3
    print(f"{k} steps: period {us(tot['period']):.1f} us, GPU busy {us(tot['busy']):.1f} us, "
          f"idle {us(tot['period'] - tot['busy']):.1f} us, {tot['kernels'] / k:.0f} kernels/copies")
    print(f"  forward: {tot['fwd_kernels'] / k:.0f} kernels, span {us(tot['fwd_span']):.1f} us, "
          f"busy {us(tot['fwd_busy']):.1f} us, gaps inside {us(tot['fwd_span'] - tot['fwd_busy']):.1f} us; "
          f"outside the forward (sampling, copies, host) {us(tot['period'] - tot['fwd_span']):.1f} us")
    print(f"  {'kernel':60s} {'n/step':>6s} {'us each':>8s} {'us/step':>8s}")
    for nm, (c, d) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {nm:60s} {c / k:6.1f} {d / c / 1e3:8.2f} {d / k / 1e3:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
