"""ckptd against its peers, on the same machine, state and run.

For each state (layout x total size, over --world CPU ranks with gloo) and
each method, in this order: start fresh rank processes (worker.py) that
save (warm-up + timed reps), then fresh ones that restore (a restarted
trainer), after dropping the page cache; ckptd methods get their own fresh
daemon on a fresh root in the same directory, stopped afterwards. fio
measures the disk (sequential O_DIRECT write and read) in that directory
first. Everything written is removed as soon as it is measured.

Writes the results (JSON) and hands them to report.py (table, plots, the
generated sections of docs/BENCHMARKS.md and README.md).

    bench/peers/run.sh [--quick] [--dir DIR] [--bin-dir build] ...
"""

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import report  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30

ALL_METHODS = ["ckptd", "ckptd-tier", "dcp-save", "dcp-async-thread", "dcp-async-process",
               "dcp-async-thread-shm", "dcp-async-process-shm", "torch-checkpointing",
               "torch-save"]


def parse_size(s):
    s = s.strip().upper()
    for suffix, mult in (("G", GiB), ("M", MiB), ("K", 1024)):
        if s.endswith(suffix):
            return int(float(s[:-1]) * mult)
    return int(s)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def find_bin_dir(arg):
    for d in ([arg] if arg else [os.path.join(REPO, "build"), os.path.join(REPO, "build-nocuda")]):
        for daemon in ("ckptd", "daemon/ckptd"):
            if os.path.isfile(os.path.join(d, daemon)):
                return os.path.abspath(d), os.path.join(os.path.abspath(d), daemon)
    sys.exit(f"no ckptd binary under {arg or 'build/ or build-nocuda/'} (build first)")


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def drop_caches_permitted():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True, ""
    except OSError as e:
        return False, str(e)


# ---- fio ------------------------------------------------------------------

def fio(dir, rw, size, end_fsync=False):
    out = subprocess.run(
        ["fio", "--name=peers-fio", f"--directory={dir}", f"--rw={rw}", "--bs=8M",
         f"--size={size}", "--ioengine=io_uring", "--iodepth=16", "--direct=1",
         f"--end_fsync={int(end_fsync)}", "--output-format=json"],
        capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job["read" if rw == "read" else "write"]["bw_bytes"]


def measure_fio(dir, size, reps):
    """The disk's own limits. The write that the durable times are compared
    with ends with an fsync, as every durable save does: O_DIRECT bypasses
    the guest's page cache but not a volatile write cache below it (the
    device's, or a VM host's), and only the flush waits until the bytes are
    durable. The write without the flush is measured too and reported
    beside it (an earlier run saw 2.51 GB/s unflushed for 1 GiB on a disk
    that took 0.7-0.8 GB/s some hours later)."""
    d = os.path.join(dir, "fio")
    os.makedirs(d, exist_ok=True)
    w, w_unsynced, r = [], [], []
    try:
        for _ in range(reps):
            w_unsynced.append(fio(d, "write", size))
            w.append(fio(d, "write", size, end_fsync=True))
            subprocess.run(["sync"])
            r.append(fio(d, "read", size))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"size_bytes": size, "write_end_fsync": True,
            "write_Bps_runs": w, "read_Bps_runs": r,
            "write_unsynced_Bps_runs": w_unsynced,
            "write_Bps": statistics.median(w), "read_Bps": statistics.median(r),
            "write_unsynced_Bps": statistics.median(w_unsynced)}


# ---- ckptd daemon ---------------------------------------------------------

class Daemon:
    def __init__(self, binary, bin_dir, dir, flags):
        self.socket = os.path.join(dir, "ckptd.sock")
        self.root = os.path.join(dir, "root")
        self.log_path = os.path.join(dir, "ckptd.log")
        self.flags = flags
        self.cmd = [binary, "--socket", self.socket, "--root", self.root] + flags
        self.ckptctl = os.path.join(bin_dir, "client", "ckptctl")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if self.proc.poll() is not None:
                break
            if os.path.exists(self.socket) and subprocess.run(
                    [self.ckptctl, "--socket", self.socket, "status"],
                    capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ckptd did not start: {open(self.log_path).read()[-2000:]}")

    def peak_rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---- ranks ------------------------------------------------------------------

def run_ranks(a, env, method, phase, layout, nbytes, dir, opts, reps):
    store = tempfile.mktemp(prefix="gloo-", dir=dir)
    outs = [os.path.join(dir, f"{phase}-rank{r}.json") for r in range(a.world)]
    logs = [open(os.path.join(dir, f"{phase}-rank{r}.log"), "w") for r in range(a.world)]
    cmd = lambda r: [sys.executable, os.path.join(HERE, "worker.py"), "--method", method,
                     "--phase", phase, "--rank", str(r), "--world", str(a.world),
                     "--layout", layout, "--bytes", str(nbytes), "--dir", dir,
                     "--store", store, "--out", outs[r], "--reps", str(reps),
                     "--warmup", str(a.warmup), "--opts", json.dumps(opts)] + (
                         ["--drop-caches"] if a.drop_caches else []) + (
                         ["--profile", os.path.join(dir, "profile.txt")]
                         if a.profile and phase == "save" else [])
    procs = [subprocess.Popen(cmd(r), stdout=logs[r], stderr=subprocess.STDOUT, env=env,
                              cwd=dir) for r in range(a.world)]
    deadline = time.time() + a.phase_timeout
    failed = None
    while any(p.poll() is None for p in procs):
        if time.time() > deadline:
            failed = f"{phase} timed out after {a.phase_timeout} s"
            break
        bad = [p for p in procs if p.poll() not in (None, 0)]
        if bad:
            failed = f"{phase}: a rank exited with {bad[0].returncode}"
            break
        time.sleep(0.2)
    if failed:
        time.sleep(2)
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p in procs:
        p.wait()
    for f in logs:
        f.close()
    if failed or any(p.returncode != 0 for p in procs):
        tails = []
        for r in range(a.world):
            with open(os.path.join(dir, f"{phase}-rank{r}.log")) as f:
                tails.append(f"--- rank {r} ---\n" + f.read()[-3000:])
        raise RuntimeError((failed or "a rank failed") + "\n" + "\n".join(tails))
    results = []
    for o in outs:
        with open(o) as f:
            results.append(json.load(f))
    return results


def memory_need(method, nbytes, pool, tier):
    """Rough bytes the method needs beyond what is running now."""
    if method.startswith("ckptd"):
        return nbytes + pool + (tier if method == "ckptd-tier" else 0)
    if method in ("dcp-save", "torch-save"):
        return nbytes
    return 2 * nbytes + (nbytes if "process" in method and "shm" not in method else 0)


def run_method(a, env, bins, method, layout, nbytes, base, fio_res):
    bin_dir, binary = bins
    dir = os.path.join(base, f"{method}-{layout}-{nbytes >> 20}M")
    os.makedirs(dir)
    pool = a.pool_bytes or (nbytes // 1 + 64 * MiB)
    tier = nbytes + nbytes // 8 + 64 * MiB
    need = memory_need(method, nbytes, pool, tier)
    avail = mem_available()
    rec = {"method": method, "layout": layout, "state_bytes": nbytes}
    if need > avail - 1 * GiB:
        rec["skipped"] = (f"needs about {need / GiB:.1f} GiB, {avail / GiB:.1f} GiB "
                          "available now (machine shared)")
        log(f"  {method}: SKIPPED, {rec['skipped']}")
        return rec
    daemon = None
    opts = {}
    try:
        if method.startswith("ckptd"):
            flags = ["--pool_bytes", str(pool), "--io_workers", str(a.io_workers)]
            if method == "ckptd-tier":
                flags += ["--keep_in_memory_bytes", str(tier)]
            if method == "ckptd-capped":
                rate = a.cap_rate or int(fio_res["write_Bps"] * a.cap_fraction)
                flags += ["--write_rate_limit", str(rate)]
                rec["write_rate_limit_Bps"] = rate
            daemon = Daemon(binary, bin_dir, dir, flags)
            rec["daemon_flags"] = flags
            opts = {"socket": daemon.socket, "job": "bench"}
        t0 = time.time()
        saved = run_ranks(a, env, method, "save", layout, nbytes, dir, opts, a.reps)
        rec["save_wall_s"] = time.time() - t0
        last = saved[0]["last_rep"]
        if method.startswith("ckptd"):
            ckpt_dir = os.path.join(daemon.root, "bench", f"ckpt-{last:03d}")
            rec["writer_peak_rss_bytes"] = daemon.peak_rss()
            rec["writer"] = "daemon (pool + tier included)"
            rec["pool_bytes"] = pool
        else:
            ckpt_dir = os.path.join(dir, f"ckpt-{last:03d}")
            child = [s.get("child_peak_rss_bytes") for s in saved]
            if all(c is not None for c in child):
                rec["writer_peak_rss_bytes"] = sum(child)
                rec["writer"] = f"{sum(s['child_processes'] for s in saved)} child processes"
        rec["bytes_written"] = tree_bytes(ckpt_dir)
        if a.profile and os.path.exists(os.path.join(dir, "profile.txt")):
            prof = os.path.join(HERE, "results", f"profile-{method}-{layout}-{nbytes >> 20}M.txt")
            os.makedirs(os.path.dirname(prof), exist_ok=True)
            shutil.copyfile(os.path.join(dir, "profile.txt"), prof)
            rec["profile"] = os.path.relpath(prof, REPO)
        if method != "ckptd-capped":
            t0 = time.time()
            restored = run_ranks(a, env, method, "restore", layout, nbytes, dir,
                                 dict(opts, last_rep=last), a.restore_reps)
            rec["restore_wall_s"] = time.time() - t0
            rec["restore_verified"] = all(
                r["fingerprint"] == s["fingerprint"] for r, s in zip(restored, saved))
            rec["dropped_caches"] = restored[0]["dropped_caches"]
            rec["restore_raw"] = [r["restore_s"] for r in restored]
            if "restore_source" in restored[0]:
                rec["restore_source"] = restored[0]["restore_source"]
        rec["raw"] = saved
        summarize(rec, saved)
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec["error"] = str(e)[-4000:]
        log(f"  {method}: FAILED\n{rec['error']}")
    finally:
        if daemon is not None:
            if "writer_peak_rss_bytes" in rec:
                try:
                    rec["daemon_peak_rss_after_restore_bytes"] = daemon.peak_rss()
                except OSError:
                    pass
            daemon.stop()
        if not a.keep:
            shutil.rmtree(dir, ignore_errors=True)
    return rec


def summarize(rec, saved):
    """Job-level figures: per rep the slowest rank (a step waits for every
    rank), then the median over reps."""
    reps = len(saved[0]["reps"])
    for key in ("call_s", "staged_s", "durable_s"):
        per_rep = [max(s["reps"][i][key] for s in saved) for i in range(reps)]
        rec[key + "_runs"] = per_rep
        rec[key] = statistics.median(per_rep)
    if "restore_raw" in rec:
        n = len(rec["restore_raw"][0])
        per_rep = [max(r[i] for r in rec["restore_raw"]) for i in range(n)]
        rec["restore_s_runs"] = per_rep
        rec["restore_s"] = statistics.median(per_rep)
    rec["extra_trainer_rss_bytes"] = max(s["extra_peak_rss_bytes"] for s in saved)
    rec["extra_trainer_rss_bytes_per_rank"] = [s["extra_peak_rss_bytes"] for s in saved]
    rec["state_bytes_actual"] = sum(s["local_bytes"] for s in saved)
    rec["warmup"] = [s.get("warmup") for s in saved]


def probe_pinned(env):
    """What the installed torch does with the pinned staging options on this
    machine (no accelerator here: expected to be ignored or refused)."""
    code = r"""
import json, warnings, torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
out = {"torch": torch.__version__, "accelerator": bool(torch.accelerator.is_available())}
for name, opts in [("use_pinned_memory", dict(use_pinned_memory=True, use_non_blocking_copy=False)),
                   ("use_non_blocking_copy", dict(use_pinned_memory=True, use_non_blocking_copy=True))]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            s = DefaultStager(StagingOptions(use_shared_memory=True, use_async_staging=True, **opts))
            st = s._state_dict_stager
            r = s.stage({"t": torch.ones(1 << 16)})
            r = r.result() if hasattr(r, "result") else r
            pinned = bool(r["t"].is_pinned()) if torch.cuda.is_available() else False
            s.close()
            out[name] = {"runs": True, "pinned": pinned, "stager_pin_memory": bool(st.pin_memory),
                         "warnings": [str(x.message)[:200] for x in w]}
        except Exception as e:
            out[name] = {"runs": False, "error": f"{type(e).__name__}: {e}"[:300]}
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": r.stderr[-500:]}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="development run: 64 MiB states (small, large, fsdp), 1 rep after 1 warm-up, "
                        "does not touch the docs unless --docs")
    p.add_argument("--dir", help="where everything is written (default: a new "
                                 "directory under /tmp; removed unless --keep)")
    p.add_argument("--bin-dir", help="build directory holding ckptd and python/ "
                                     "(default: build, else build-nocuda)")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--sizes", default="1G,4G", help="total state sizes (flat layouts)")
    p.add_argument("--layouts", default="small,large")
    p.add_argument("--fsdp-bytes", default="1G", help="FSDP2 model+optimizer state; 0: none")
    p.add_argument("--methods", default=",".join(ALL_METHODS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--restore-reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed saves before the reps")
    p.add_argument("--fio-reps", type=int, default=3)
    p.add_argument("--fio-size", help="default: the largest state (at most 4 GiB)")
    p.add_argument("--no-fio-per-state", dest="fio_per_state", action="store_false",
                   help="compare every state with the one fio run at the start, not "
                        "with fio run again before the state")
    p.add_argument("--pool-bytes", type=int, default=0,
                   help="ckptd --pool_bytes (default: the state + 64 MiB)")
    p.add_argument("--io-workers", type=int, default=4, help="ckptd --io_workers")
    p.add_argument("--capped-state", default="large:1G",
                   help="LAYOUT:SIZE of the write-capped ckptd save ('' : none)")
    p.add_argument("--cap-fraction", type=float, default=0.25,
                   help="--write_rate_limit as a fraction of fio's write rate")
    p.add_argument("--cap-rate", type=int, default=0, help="--write_rate_limit in B/s")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false")
    p.add_argument("--phase-timeout", type=int, default=1800)
    p.add_argument("--keep", action="store_true", help="keep the checkpoints and logs")
    p.add_argument("--profile", action="store_true",
                   help="diagnostic: cProfile rank 0's timed saves into bench/peers/"
                        "results/profile-*.txt (slows the calls; not for the figures)")
    p.add_argument("--results", help="results file (default: bench/peers/results/"
                                     "peers-<time>.json, and latest.json / quick.json)")
    p.add_argument("--docs", dest="docs", action="store_true", default=None,
                   help="update docs/ (default: yes, except with --quick)")
    p.add_argument("--no-docs", dest="docs", action="store_false")
    a = p.parse_args()
    if a.quick:
        a.sizes, a.fsdp_bytes, a.reps, a.restore_reps, a.warmup, a.fio_reps = (
            "64M", "64M", 1, 1, 1, 1)
        if a.capped_state == "large:1G":
            a.capped_state = "large:64M"
    if a.docs is None:
        a.docs = not a.quick

    bins = find_bin_dir(a.bin_dir)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(bins[0], "python")] + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    made_dir = a.dir is None
    base = a.dir or tempfile.mkdtemp(prefix="ckptd-peers-")
    os.makedirs(base, exist_ok=True)
    base = tempfile.mkdtemp(prefix="run-", dir=base) if not made_dir else base

    if a.drop_caches:
        ok, why = drop_caches_permitted()
        if not ok:
            log(f"cannot drop the page cache ({why}): restores may read from it "
                "(O_DIRECT readers are not helped by it anyway)")
            a.drop_caches = False
            drop_note = f"not dropped: {why}"
        else:
            drop_note = "dropped before every restore"
    else:
        drop_note = "not dropped (--no-drop-caches)"

    methods = [m for m in a.methods.split(",") if m]
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    states = [(l, s) for s in sizes for l in a.layouts.split(",") if l]
    if parse_size(a.fsdp_bytes) > 0:
        states.append(("fsdp", parse_size(a.fsdp_bytes)))
    capped = None
    if a.capped_state:
        l, s = a.capped_state.split(":")
        capped = (l, parse_size(s))
    fio_size = parse_size(a.fio_size) if a.fio_size else min(max(s for _, s in states), 4 * GiB)

    results = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": a.quick,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                    "loadavg_start": os.getloadavg()},
        "config": {k: v for k, v in vars(a).items()},
        "binary": bins[1],
        "page_cache": drop_note,
        "pinned_probe": probe_pinned(env),
        "states": [],
    }
    log(f"writing under {base}; ckptd {bins[1]}; page cache: {drop_note}")
    log(f"pinned staging probe: {json.dumps(results['pinned_probe'])}")
    try:
        log(f"fio: {fio_size >> 20} MiB sequential O_DIRECT write/read x{a.fio_reps}")
        results["fio"] = measure_fio(base, fio_size, a.fio_reps)
        log(f"  fio write {results['fio']['write_Bps'] / 1e9:.2f} GB/s, "
            f"read {results['fio']['read_Bps'] / 1e9:.2f} GB/s")
        for layout, nbytes in states:
            log(f"state {layout} {nbytes >> 20} MiB over {a.world} ranks")
            # restore_source: one tensor loaded again through the low-level
            # client (earlier results files asked for byte items only, which
            # always say "storage"; report.py ignores those).
            st = {"layout": layout, "state_bytes": nbytes, "methods": [],
                  "restore_source_check": "tensor"}
            results["states"].append(st)
            if a.fio_per_state:
                # The disk's rate drifts by 2x over minutes on a shared VM
                # (notes.md, durable-vs-fio): each state is compared with a
                # figure taken just before its methods run.
                st["fio"] = measure_fio(base, min(nbytes, 4 * GiB), a.fio_reps)
                log(f"  fio before this state ({min(nbytes, 4 * GiB) >> 20} MiB): write "
                    f"{st['fio']['write_Bps'] / 1e9:.2f} GB/s, "
                    f"read {st['fio']['read_Bps'] / 1e9:.2f} GB/s")
            todo = list(methods)
            if capped == (layout, nbytes) and "ckptd" in todo:
                todo.insert(todo.index("ckptd") + 1, "ckptd-capped")
            for m in todo:
                rec = run_method(a, env, bins, m, layout, nbytes, base,
                                 st.get("fio") or results["fio"])
                st["methods"].append(rec)
                if "durable_s" in rec:
                    log(f"  {m}: call {rec['call_s'] * 1e3:.1f} ms, staged "
                        f"{rec['staged_s']:.3f} s, durable {rec['durable_s']:.3f} s, "
                        f"restore {rec.get('restore_s', float('nan')):.3f} s, extra rss "
                        f"{rec['extra_trainer_rss_bytes'] / MiB:.0f} MiB")
    finally:
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        results["machine"]["loadavg_end"] = os.getloadavg()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
        out_dir = os.path.join(HERE, "results")
        os.makedirs(out_dir, exist_ok=True)
        path = a.results or os.path.join(
            out_dir, ("quick" if a.quick else "peers-" + time.strftime("%Y%m%d-%H%M%S")) + ".json")
        report.annotate(results)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        if not a.quick and not a.results:
            shutil.copyfile(path, os.path.join(out_dir, "latest.json"))
        log(f"results: {os.path.relpath(path, REPO)}")
    report.write_all(results, path, update_docs=a.docs)


if __name__ == "__main__":
    main()
