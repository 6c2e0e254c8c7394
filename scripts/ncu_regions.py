#!/usr/bin/env python3
"""Where one kernel's warps spend their time, by region of its SASS: the source page of an ncu
report with stall sampling (`ncu --set full --import-source yes -o R ...`, then
`ncu -i R.ncu-rep --page source --csv --print-source sass > R.csv`), cut into regions at marker
opcodes, each region's executed warp instructions and warp stall samples summed (all samples and
those of cycles where the warp issued nothing), with its three largest stall reasons where the
CSV has per-reason columns.

The default markers fit the kernels that copy with cp.async and wait on the previous kernel
(programmatic dependent launch): LDGDEPBAR (a cp.async group committed), ACQBULK
(griddepcontrol.wait), DEPBAR (a cp.async wait), BAR (a block barrier). A region runs from one
marker up to the next, so e.g. "ACQBULK -> DEPBAR" is the work after the dependency wait and before
the copies are waited on. Straight-line order is the address order; loops and branches count where
their instructions lie.

Usage: ncu_regions.py R.csv [--markers LDGDEPBAR,ACQBULK,DEPBAR,BAR]"""
import argparse
import csv
import gzip
import re


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--markers", default="LDGDEPBAR,ACQBULK,DEPBAR,BAR")
    args = ap.parse_args()
    markers = args.markers.split(",")
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt", errors="replace") as f:
        rows = [r for r in csv.reader(f)]
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    cols = {h: i for i, h in enumerate(rows[head])}

    def col(*names):
        for n in names:
            for h, i in cols.items():
                if h.strip() == n:
                    return i
        return None

    src = col("Source")
    executed = col("Warp Instructions Executed", "Instructions Executed")
    samples = col("Warp Stall Sampling (All Samples)")
    idle = col("Warp Stall Sampling (Not-issued Samples)", "Warp Stall Sampling (Not Issued Samples)")
    reasons = [(h, i) for h, i in cols.items() if h.startswith("stall_") or h.startswith("smsp__pcsamp_warps_issue_stalled")]
    regions = []  # [name, instructions, samples, idle samples, {reason: samples}]
    current = ["start", 0.0, 0.0, 0.0, {}, 0]
    for r in rows[head + 1:]:
        if len(r) <= src:
            continue
        op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0]
        base = op.split(".")[0]
        if base in markers:
            regions.append(current)
            current = [f"{len(regions)} {base} ->", 0.0, 0.0, 0.0, {}, 0]
        current[1] += number(r[executed]) if executed is not None else 0.0
        current[2] += number(r[samples]) if samples is not None else 0.0
        current[3] += number(r[idle]) if idle is not None else 0.0
        current[5] += 1
        for h, i in reasons:
            current[4][h] = current[4].get(h, 0.0) + number(r[i])
    regions.append(current)
    total = [sum(x[k] for x in regions) for k in (1, 2, 3)]
    print(f"{'region (from the marker on)':<28} {'SASS':>5} {'warp instrs':>12} {'stall samples':>14} {'share':>6} {'not issued':>11}  top reasons")
    for name, instrs, s, ni, by, n in regions:
        top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
        top_text = ", ".join(f"{re.sub('^(stall_|smsp__pcsamp_warps_issue_stalled_)', '', h)} {v:.0f}" for h, v in top if v > 0)
        share = s / total[1] if total[1] else 0.0
        print(f"{name:<28} {n:>5} {instrs:>12.0f} {s:>14.0f} {share:>6.1%} {ni:>11.0f}  {top_text}")
    print(f"{'total':<28} {'':>5} {total[0]:>12.0f} {total[1]:>14.0f} {'':>6} {total[2]:>11.0f}")


if __name__ == "__main__":
    main()
