#!/usr/bin/env python3
"""Plots of bench/remote results (issue 30, item 9) for docs/BENCHMARKS.md.

    .venv/bin/python bench/remote/plot.py RUN.json [RUN.json ...] [--img-dir docs/img]

Writes two PNGs (matplotlib, from scripts/requirements-bench.txt):
  remote-rates.png   the median run of those given (by its restore ratio): every
                     path's rate on the same bytes and server, and the trainer's
                     save call and STAGED with and without --remote, per rep;
  remote-ratios.png  the three targeted ratios of every run given, beside their
                     targets, so the spread between runs is visible.
"""
import argparse
import json
import os
import statistics

TARGETS = [  # (key in summary.ratios, label)
    ("upload_rate_vs_best_raw", "upload rate / best raw client (target 0.9)"),
    ("remote_commit_vs_s3tc_durable", "s3torchconnector's time to durable / ckptd's (target 1.0)"),
    ("remote_restore_vs_best_raw_get", "restore rate / best raw client's GETs (target 0.9)"),
]


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    runs.sort(key=lambda r: r["when"])
    return runs


def run_label(r):
    return f"{r['when'][5:16]}\n{r.get('git', '?')}"


def median_run(runs):
    """The run whose restore ratio is the median (the ratio that spreads most)."""
    key = lambda r: r["summary"]["ratios"]["remote_restore_vs_best_raw_get"]["value"]
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def rates_figure(plt, r):
    s = r["summary"]
    gb = r["bytes_moved"] / 1e9
    rate = lambda sec: gb / sec
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))

    def bars(ax, rows, title, xlabel):
        names = [n for n, _ in rows]
        vals = [v for _, v in rows]
        colors = ["tab:green" if n.startswith("ckptd") else "tab:gray" for n in names]
        ax.barh(range(len(rows)), vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.3f}", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_xlim(0, max(vals) * 1.25)
        ax.grid(axis="x", alpha=0.3)

    bars(axes[0], [
        ("ckptd: local commit -> remote commit", s["ckptd_upload_GBps"]),
        ("ckptd: save call -> remote commit", rate(s["ckptd_on_remote_committed_s"])),
        ("s3torchconnector DCP writer: save -> durable", rate(s["s3tc_durable_s"])),
        (f"boto3 upload (best config)", rate(s["boto3_upload_s"])),
        (f"s5cmd cp up (best config)", rate(s["s5cmd_upload_s"])),
    ], "Into the remote tier", "GB/s (higher is better)")
    bars(axes[1], [
        ("ckptd: fresh daemon, empty --root", s["ckptd_restore_GBps"]),
        ("s3torchconnector DCP reader", rate(s["s3tc_load_s"])),
        ("boto3 ranged GETs (best config)", rate(s["boto3_download_s"])),
        ("s5cmd cp down (best config)", rate(s["s5cmd_download_s"])),
    ], "Out of the remote tier (a replacement node)", "GB/s (higher is better)")

    ax = axes[2]
    series = [
        ("call, no --remote", s["ckptd_off_call_s_reps"], 1e3),
        ("call, --remote", s["ckptd_on_call_s_reps"], 1e3),
        ("STAGED, no --remote", s["ckptd_off_staged_s_reps"], 1e3),
        ("STAGED, --remote", s["ckptd_on_staged_s_reps"], 1e3),
    ]
    for i, (name, reps, scale) in enumerate(series):
        vals = [v * scale for v in reps]
        ax.scatter(vals, [i] * len(vals), color="tab:blue" if "no --remote" in name
                   else "tab:green", s=18)
        ax.text(max(vals) * 1.4, i, f"median {statistics.median(vals):.2f} ms",
                fontsize=7, va="center")
    ax.set_xscale("log")
    ax.set_xlim(0.05, 50000)  # room for the medians beside the points
    ax.set_ylim(len(series) - 0.5, -0.5)
    ax.set_yticks(range(len(series)))
    ax.set_yticklabels([n for n, _, _ in series], fontsize=8)
    ax.set_xlabel("ms, each rep's slowest rank (log)")
    ax.set_title("The trainer's save, with and without --remote", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"ckptd's remote tier against the alternatives: {gb:.2f} GB, "
                 f"{r['args']['world']} ranks, one SeaweedFS on loopback, "
                 f"{r['machine']['cpus']} cores (run {r['when']}, {r.get('git', '?')})",
                 fontsize=10)
    return fig


def ratios_figure(plt, runs):
    fig, axes = plt.subplots(1, len(TARGETS), figsize=(17, 4), sharey=False)
    x = list(range(len(runs)))
    for ax, (key, label) in zip(axes, TARGETS):
        vals = [r["summary"]["ratios"][key]["value"] for r in runs]
        target = runs[0]["summary"]["ratios"][key]["target"]
        ax.plot(x, vals, "o-", color="tab:green")
        ax.axhline(target, color="tab:red", linestyle="--", label=f"target {target}")
        med = statistics.median(vals)
        ax.axhline(med, color="tab:gray", linestyle=":", label=f"median {med:.2f}")
        ax.set_xticks(x)
        ax.set_xticklabels([run_label(r) for r in runs], fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.set_ylim(min(0.6, min(vals) - 0.05), max(1.3, max(vals) + 0.05))
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    fig.suptitle("Issue 30's three ratios, run by run (each run: median of its reps)",
                 fontsize=10)
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="results JSONs of bench/remote/driver.py")
    p.add_argument("--img-dir", default=os.path.join(os.path.dirname(__file__),
                                                     "..", "..", "docs", "img"))
    a = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load(a.runs)
    os.makedirs(a.img_dir, exist_ok=True)
    for name, fig in (("remote-rates", rates_figure(plt, median_run(runs))),
                      ("remote-ratios", ratios_figure(plt, runs))):
        fig.tight_layout()
        path = os.path.join(a.img_dir, name + ".png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(path)


if __name__ == "__main__":
    main()
