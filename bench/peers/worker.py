"""One trainer rank of the peer benchmark (a fresh interpreter per rank and
per method, started by driver.py; gloo over a file store on CPU).

Phase "save": builds the state, resets its peak RSS, runs `warmup` untimed
saves and `reps` timed ones (all ranks start each together, after a
barrier), and writes {times per rep, extra peak RSS, writer processes'
peak RSS, fingerprint} to --out.
Phase "restore" (fresh processes: a restarted trainer): builds a template
of the same structure holding other values, then `reps` times: rank 0
drops the page cache (if --drop-caches), barrier, load in place, barrier;
checks the fingerprint against the saved one.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import methods  # noqa: E402
import procmem  # noqa: E402
import states  # noqa: E402


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def run(a):
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=a.rank,
                            world_size=a.world)
    torch.set_num_threads(1)  # 4 ranks on 2 cores: no oversubscription
    opts = json.loads(a.opts)
    out = {"rank": a.rank, "method": a.method, "phase": a.phase}
    state, keep = states.build(a.layout, a.bytes, a.rank, a.world,
                               fill=a.phase == "save", seed=a.seed)
    out["local_bytes"] = states.local_bytes(state)
    method = methods.make(a.method, a.dir, a.rank, a.world, opts)
    sampler = procmem.DescendantPeaks() if method.writes_from_child_process else None
    try:
        if a.phase == "save":
            out.update(save_phase(a, method, state))
        else:
            out.update(restore_phase(a, method, state))
    finally:
        method.close()
        if sampler is not None:
            sampler.stop()
            out["child_peak_rss_bytes"] = sampler.total()
            out["child_processes"] = sampler.count()
    dist.barrier()
    dist.destroy_process_group()
    del keep
    with open(a.out, "w") as f:
        json.dump(out, f)


def save_phase(a, method, state):
    import gc
    gc.collect()
    out = {"fingerprint": states.fingerprint(state)}
    out["peak_reset"] = procmem.reset_peak()
    out["rss_before_bytes"] = procmem.rss_bytes()
    reps = []
    profiler = None
    if a.profile and a.rank == 0:
        import cProfile
        profiler = cProfile.Profile()
    for rep in range(a.warmup + a.reps):
        dist.barrier()
        if profiler is not None and rep >= a.warmup:
            profiler.enable()
        call, staged, durable = method.save(state, rep)
        if profiler is not None:
            profiler.disable()
        dist.barrier()
        if rep >= a.warmup:
            reps.append({"call_s": call, "staged_s": staged, "durable_s": durable})
        else:
            out.setdefault("warmup", []).append(
                {"call_s": call, "staged_s": staged, "durable_s": durable})
    out["reps"] = reps
    if profiler is not None:
        import io
        import pstats
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        with open(a.profile, "w") as f:
            f.write(text.getvalue())
    out["peak_rss_bytes"] = procmem.peak_bytes()
    out["extra_peak_rss_bytes"] = out["peak_rss_bytes"] - out["rss_before_bytes"]
    out["last_rep"] = a.warmup + a.reps - 1
    return out


def restore_phase(a, method, state):
    out = {"restore_s": [], "dropped_caches": []}
    for _ in range(a.reps):
        dist.barrier()
        if a.rank == 0:
            out["dropped_caches"].append(drop_caches() if a.drop_caches else False)
        dist.barrier()
        t0 = time.perf_counter()
        method.restore(state)
        out["restore_s"].append(time.perf_counter() - t0)
        dist.barrier()
    out["fingerprint"] = states.fingerprint(state)
    if a.rank == 0 and hasattr(method, "restore_source"):
        try:
            out["restore_source"] = method.restore_source(state)
        except Exception as e:  # noqa: BLE001 - a check, not a figure
            out["restore_source"] = f"unknown ({type(e).__name__}: {e})"[:200]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--method", required=True)
    p.add_argument("--phase", choices=["save", "restore"], required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--drop-caches", action="store_true")
    p.add_argument("--opts", default="{}")
    p.add_argument("--profile", help="rank 0: cProfile its timed saves into this file "
                                     "(a diagnostic run: the profiler slows the call)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
