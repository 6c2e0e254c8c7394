#!/usr/bin/env python3
"""Where a serving run's GPU time goes, from a bench/cupti_trace.cpp trace (CSV).

A step starts at each embedding kernel (the first kernel of every forward; its grid is the
step's token count) and lasts to the next one. The run is the steps after the last one of at
most 4 tokens (serve_bench's warm-up decodes 4 requests; a run of 16 or more requests at once
never steps that few), so trace one --concurrency per process; --all-steps keeps every step (a
generate_bench run of batch 1, whose decode steps are all of one token). With --last-prefill the
run is the steps from the last prefill step on (a generate_bench run: trace one --batch with
--repeat 1, the warm-up run comes before it).
Prints: the run's wall span split into prefill steps (a prefill attention kernel in them) and
decode-only steps, each step's period, kernel-busy time and GPU idle (period minus the union of
kernels and copies), the host's CUDA runtime time per call name; then for the decode steps of
the most common token count, the mean time per kernel (name and grid, so GEMMs of different
shapes stay apart) and one layer's kernels in launch order.
--order: every kernel of the common decode step in launch order, averaged over those steps (they
replay one graph, so position i is the same kernel in each): start offset, duration, the gap from
the previous kernel's end to its start (negative: it started under PDL while the previous one ran)
and the advance of the end (end minus the previous kernel's end: the kernel's share of the step's
critical path when each kernel's work waits for the one before), each the median over the steps;
then the ends' advance summed per kernel name, and one layer's kernels averaged over the layers.
Usage: cupti_steps.py TRACE.csv [--steps] [--top N] [--all-steps] [--last-prefill] [--order]"""
import collections
import csv
import statistics
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"xserv::(cuda::)?(\(anonymous namespace\)::)?", "", name)
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"<.*>$", "", name) if len(name) > 64 else name
    return name[:64]


def union(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def main(path, show_steps, top, all_steps=False, last_prefill=False, order=False):
    gpu, api = [], []
    with open(path, errors="replace") as f:
        for r in csv.DictReader(f):
            s, e = int(r["start_ns"]), int(r["end_ns"])
            if r["kind"] == "api":
                api.append((s, e, r["name"]))
            else:
                gpu.append((s, e, r["kind"], int(r["grid_x"]), r["grid_y"], r["grid_z"], r["name"],
                            int(r["graph_id"])))
    gpu.sort()
    emb = [i for i, g in enumerate(gpu) if g[2] == "kernel" and re.search(r"embedding(_vec)?_kernel", g[6])]
    if len(emb) < 3:
        raise SystemExit(f"{len(emb)} embedding kernels in {path}")
    small = [] if all_steps else [k for k, i in enumerate(emb) if gpu[i][3] <= 4]
    first = small[-1] + 1 if small else 0
    if last_prefill:
        big = [k for k, i in enumerate(emb) if gpu[i][3] > 4]
        first = big[-1] if big else 0
    starts = emb[first:]
    steps = []
    for k, a in enumerate(starts):
        b = starts[k + 1] if k + 1 < len(starts) else len(gpu)
        seg = gpu[a:b]
        t0 = seg[0][0]
        t1 = gpu[b][0] if b < len(gpu) else max(g[1] for g in seg)
        kern = [g for g in seg if g[2] == "kernel"]
        busy = union([(g[0], g[1]) for g in seg])
        ksum = sum(g[1] - g[0] for g in kern)
        prefill = any("prefill" in g[6] for g in kern)
        graph = any(g[7] != 0 for g in kern)  # replayed from a CUDA graph
        steps.append(dict(t0=t0, t1=t1, tokens=seg[0][3], prefill=prefill, period=t1 - t0,
                          busy=busy, ksum=ksum, n=len(kern), seg=seg, graph=graph))
    span = steps[-1]["t1"] - steps[0]["t0"]
    print(f"run: {len(steps)} steps over {span / 1e6:.2f} ms (first embedding to the last step's end)")
    for kind in (True, False):
        ss = [s for s in steps if s["prefill"] == kind]
        if not ss:
            continue
        tot = lambda key: sum(s[key] for s in ss)
        print(f"  {'prefill' if kind else 'decode-only'} steps: {len(ss)}, {tot('period') / 1e6:.2f} ms "
              f"({100 * tot('period') / span:.1f}%), mean period {tot('period') / len(ss) / 1e3:.1f} us, "
              f"busy {tot('busy') / len(ss) / 1e3:.1f} us, idle {(tot('period') - tot('busy')) / len(ss) / 1e3:.1f} us, "
              f"{tot('n') / len(ss):.0f} kernels, tokens {min(s['tokens'] for s in ss)}..{max(s['tokens'] for s in ss)}")
    by_tokens = collections.defaultdict(list)
    for s in steps:
        if not s["prefill"]:
            by_tokens[s["tokens"]].append(s)
    print("  decode-only steps by padded rows (steps, replayed from a graph, mean period): " + ", ".join(
        f"{t}: {len(v)} ({sum(s['graph'] for s in v)} graph) x {sum(s['period'] for s in v) / len(v) / 1e3:.0f} us"
        for t, v in sorted(by_tokens.items(), reverse=True)))
    if show_steps:
        print(f"  {'step':>4s} {'kind':>7s} {'tokens':>6s} {'period us':>9s} {'busy us':>8s} {'idle us':>8s} {'kernels':>7s} graph")
        for i, s in enumerate(steps):
            print(f"  {i:4d} {'prefill' if s['prefill'] else 'decode':>7s} {s['tokens']:6d} "
                  f"{s['period'] / 1e3:9.1f} {s['busy'] / 1e3:8.1f} {(s['period'] - s['busy']) / 1e3:8.1f} {s['n']:7d} "
                  f"{'yes' if s['graph'] else 'no'}")
    # Host: CUDA runtime calls inside the run.
    t_lo, t_hi = steps[0]["t0"], steps[-1]["t1"]
    calls = collections.defaultdict(lambda: [0, 0])
    for s, e, n in api:
        if t_lo <= s < t_hi:
            calls[n][0] += 1
            calls[n][1] += e - s
    print(f"host CUDA runtime calls in the run (count, ms total, us each):")
    for n, (c, d) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {n:40s} {c:7d} {d / 1e6:8.2f} {d / c / 1e3:8.2f}")
    # The prefill steps' kernels, and the common decode step's.
    groups = [("prefill steps", [s for s in steps if s["prefill"]])]
    if by_tokens:
        rows = max(by_tokens, key=lambda t: len(by_tokens[t]))
        groups.append((f"decode-only steps of {rows} rows", by_tokens[rows]))
    for title, ss in groups:
        if not ss:
            continue
        per = collections.defaultdict(lambda: [0, 0])
        for s in ss:
            for g in s["seg"]:
                key = (g[2] if g[2] != "kernel" else short(g[6]), f"{g[3]}x{g[4]}x{g[5]}" if g[2] == "kernel" else "")
                if g[2] != "kernel":
                    key = (g[6], "")
                per[key][0] += 1
                per[key][1] += g[1] - g[0]
        k = len(ss)
        total = sum(d for _, d in per.values())
        print(f"\n{title} ({k}): mean period {sum(s['period'] for s in ss) / k / 1e3:.1f} us, "
              f"kernel+copy time {total / k / 1e3:.1f} us a step")
        print(f"  {'kernel':64s} {'grid':>14s} {'n/step':>6s} {'us each':>8s} {'us/step':>8s} {'%':>5s}")
        for (nm, grid), (c, d) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {nm:64s} {grid:>14s} {c / k:6.1f} {d / c / 1e3:8.2f} {d / k / 1e3:8.1f} {100 * d / total:5.1f}")
        # One layer in launch order, from the middle step: the kernels from the second
        # attention-like kernel's layer (the first layer has extra work in front).
        seg = [g for g in ss[len(ss) // 2]["seg"] if g[2] == "kernel"]
        att = [i for i, g in enumerate(seg) if "attention" in g[6]]
        if len(att) >= 3:
            a, b = att[1], att[2]
            print(f"  one layer in order (start offset us, duration us, gap to the previous end us):")
            for i in range(a - (b - a) // 2, a + (b - a) - (b - a) // 2):
                g = seg[i]
                print(f"    {short(g[6]):64s} {g[3]}x{g[4]}x{g[5]:>3s} {(g[0] - seg[0][0]) / 1e3:9.1f} "
                      f"{(g[1] - g[0]) / 1e3:7.2f} {(g[0] - seg[i - 1][1]) / 1e3:6.2f}")
    if order and by_tokens:
        print_order(by_tokens[max(by_tokens, key=lambda t: len(by_tokens[t]))])


def print_order(ss):
    """The common decode step's kernels in launch order, averaged over its steps (--order)."""
    all_segs = [[g for g in s["seg"] if g[2] == "kernel"] for s in ss]
    n = collections.Counter(len(k) for k in all_segs).most_common(1)[0][0]
    segs, prev_end = [], []  # prev_end: the previous step's last kernel end, where known
    for j, k in enumerate(all_segs):
        if len(k) == n:
            segs.append(k)
            prev_end.append(max(g[1] for g in all_segs[j - 1]) if j > 0 and all_segs[j - 1] else None)
    print(f"\nthe decode step in launch order ({len(segs)} steps of {n} kernels; us, medians over the steps):")
    print(f"  {'#':>3s} {'kernel':56s} {'grid':>12s} {'start':>8s} {'dur':>7s} {'gap':>6s} {'end+':>6s}")
    by_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    tot_adv = 0.0
    for i in range(n):
        st = statistics.median(k[i][0] - k[0][0] for k in segs) / 1e3
        du = statistics.median(k[i][1] - k[i][0] for k in segs) / 1e3
        if i > 0:
            gaps = [k[i][0] - k[i - 1][1] for k in segs]
            advs = [k[i][1] - max(g[1] for g in k[:i]) for k in segs]
        else:
            pe = [(k, e) for k, e in zip(segs, prev_end) if e is not None]
            gaps = [k[0][0] - e for k, e in pe] or [0]
            advs = [k[0][1] - e for k, e in pe] or [0]
        gap, adv = statistics.median(gaps) / 1e3, statistics.median(advs) / 1e3
        tot_adv += adv
        g = segs[0][i]
        nm = short(g[6])[:56]
        by_name[nm][0] += 1
        by_name[nm][1] += du
        by_name[nm][2] += adv
        print(f"  {i:3d} {nm:56s} {f'{g[3]}x{g[4]}x{g[5]}':>12s} {st:8.1f} {du:7.2f} {gap:6.2f} {adv:6.2f}")
    print(f"  ends' advance summed: {tot_adv:.1f} us a step")
    # One layer's kernels, each position averaged over the layers past the first and before the
    # last (the layers repeat with the attention kernels' period).
    att = [i for i, g in enumerate(segs[0]) if "attention" in g[6]]
    if len(att) >= 4 and len(set(b - a for a, b in zip(att, att[1:]))) == 1:
        period = att[1] - att[0]
        first = att[1] - period // 2
        print(f"  a layer's kernels, each averaged over {len(att) - 2} layers (us):")
        print(f"  {'kernel':56s} {'grid':>12s} {'dur':>7s} {'gap':>6s} {'end+':>6s}")
        layer_sum = 0.0
        for p in range(period):
            idx = [first + p + period * j for j in range(len(att) - 2)]
            idx = [i for i in idx if 0 < i < n]
            du = sum(k[i][1] - k[i][0] for k in segs for i in idx) / (len(segs) * len(idx)) / 1e3
            gp = sum(k[i][0] - k[i - 1][1] for k in segs for i in idx) / (len(segs) * len(idx)) / 1e3
            ad = sum(k[i][1] - max(g[1] for g in k[:i]) for k in segs for i in idx) / (len(segs) * len(idx)) / 1e3
            layer_sum += ad
            g = segs[0][idx[0]]
            print(f"  {short(g[6])[:56]:56s} {f'{g[3]}x{g[4]}x{g[5]}':>12s} {du:7.2f} {gp:6.2f} {ad:6.2f}")
        print(f"  a layer's ends' advance: {layer_sum:.2f} us")
    print(f"  {'kernel':56s} {'n':>4s} {'dur sum':>8s} {'end+ sum':>8s}")
    for nm, (c, d, a) in sorted(by_name.items(), key=lambda kv: -kv[1][2]):
        print(f"  {nm:56s} {c:4d} {d:8.1f} {a:8.1f}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = 25
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
        args = [a for a in args if a != str(top)]
    main(args[0], "--steps" in sys.argv, top, "--all-steps" in sys.argv, "--last-prefill" in sys.argv,
         "--order" in sys.argv)
