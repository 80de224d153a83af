#!/usr/bin/env python3
"""Plots mncl-perf CSV results: for each collective, busbw and latency vs size, one solid curve
per backend, a dashed curve per raw-library baseline, and the memory-bandwidth limit."""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift:
            return f"{b >> shift}{unit}"
    return str(b)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: mncl_plot.py RESULTS.csv OUT.png")
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["placement"] == "out-of-place"]
    if not rows:
        sys.exit("mncl-plot: no out-of-place results in " + sys.argv[1])
    colls = list(dict.fromkeys(r["collective"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    colors = {b: f"C{i}" for i, b in enumerate(backends)}
    ranks = rows[0]["ranks"]
    fig, axes = plt.subplots(len(colls), 2, figsize=(13, 4.2 * len(colls)), squeeze=False)
    for ci, coll in enumerate(colls):
        ax_bw, ax_lat = axes[ci]
        series = defaultdict(list)
        limit = {}
        for r in rows:
            if r["collective"] != coll:
                continue
            size = int(r["size_B"])
            if size == 0:
                continue
            b = r["backend"]
            if not r["busbw_GBps"]:  # N/A (one-rank sendrecv: no data moves)
                continue
            series[(b, "mncl")].append((size, float(r["busbw_GBps"]), float(r["time_us"])))
            if r["raw_time_us"]:
                series[(b, r["baseline"])].append(
                    (size, float(r["raw_busbw_GBps"]), float(r["raw_time_us"])))
            if r["limit_busbw_GBps"]:
                limit[b] = float(r["limit_busbw_GBps"])
        for (b, kind), pts in series.items():
            pts.sort()
            xs = [p[0] for p in pts]
            raw = kind != "mncl"
            label = f"raw {kind} (beside MNCL-{b})" if raw else f"MNCL-{b}"
            style = dict(color=colors[b], linestyle="--" if raw else "-",
                         marker="x" if raw else "o", markersize=3, label=label)
            ax_bw.plot(xs, [p[1] for p in pts], **style)
            ax_lat.plot(xs, [p[2] for p in pts], **style)
        if limit:
            # The machine's limit, measured by every run; the runs agree to within noise.
            lim = max(limit.values())
            ax_bw.axhline(lim, color="gray", linestyle=":",
                          label=f"memory-bandwidth limit ({lim:.1f} GB/s busbw)")
        for ax, ylabel in ((ax_bw, "busbw (GB/s)"), (ax_lat, "time per call (us)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ticks = sorted({int(r["size_B"]) for r in rows if int(r["size_B"]) > 0})
            ax.set_xticks(ticks[::2] if len(ticks) > 12 else ticks)
            ax.set_xticklabels([size_label(t) for t in (ticks[::2] if len(ticks) > 12 else ticks)],
                               rotation=45)
        ax_bw.set_title(f"{coll}: bus bandwidth ({ranks} ranks)")
        ax_lat.set_title(f"{coll}: latency ({ranks} ranks)")
        ax_bw.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=90)
    print(f"mncl-plot: wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    main()
