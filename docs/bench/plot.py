#!/usr/bin/env python3
"""Benchmark plots for docs/benchmarks.md from recorded results (docs/bench/*.json).

Each JSON file holds one machine's recorded figures: workloads (each in a group such as
"decode" or "prefill") with one result per system (xserv, llama.cpp, transformers; null when
not measured) and where every number was recorded. For every file and group this writes
docs/bench/<file>-<group>.png: one small panel per workload (each with its own scale, since
GPT-2 and Qwen3-8B differ tenfold), a bar per system, the value written on the bar.
Needs matplotlib (Debian python3-matplotlib); run through scripts/bench-plots.sh.
Usage: plot.py [JSON ...]    (default: every docs/bench/*.json)
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

COLORS = {"xserv": "#1f77b4", "llama.cpp": "#ff7f0e", "transformers": "#7f7f7f"}
HERE = os.path.dirname(os.path.abspath(__file__))


def human(v):
    return f"{v / 1000:.1f}k" if v >= 10000 else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def plot_group(data, group, title, out_path):
    workloads = [w for w in data["workloads"] if w["group"] == group]
    systems = data["systems"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(3.0 * len(workloads) + 0.6, 3.4),
                             squeeze=False)
    for ax, w in zip(axes[0], workloads):
        values = [(w["results"].get(s) or {}).get("value") for s in systems]
        top = max(v for v in values if v is not None)
        for x, (s, v) in enumerate(zip(systems, values)):
            if v is None:
                ax.text(x, top * 0.03, "not\nmeasured", ha="center", va="bottom", fontsize=8,
                        color="#555555")
                continue
            ax.bar(x, v, color=COLORS.get(s, "#2ca02c"), width=0.7)
            ax.text(x, v + top * 0.02, human(v), ha="center", va="bottom", fontsize=9,
                    fontweight="bold" if s == "xserv" else "normal")
        ax.set_xticks(range(len(systems)), systems, fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_title(w["label"], fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v >= 10000 else f"{v:g}"))
        ax.spines[["top", "right"]].set_visible(False)
    axes[0][0].set_ylabel(data.get("unit", "tokens/s"), fontsize=9)
    fig.suptitle(f"{title}: higher is better", fontsize=11)
    fig.text(0.5, 0.01, data["machine"], ha="center", fontsize=7, color="#555555", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main(paths):
    for path in paths or sorted(glob.glob(os.path.join(HERE, "*.json"))):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        stem = os.path.splitext(os.path.basename(path))[0]
        for group, title in data["groups"].items():
            out = os.path.join(os.path.dirname(path), f"{stem}-{group}.png")
            plot_group(data, group, title, out)
            print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
