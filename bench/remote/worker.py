"""One trainer rank of the remote-tier benchmark (a fresh interpreter per
rank and phase, started by driver.py; gloo over a file store on CPU). The
state is bench/peers/states.py's (layout "large" by default: 8 float32
DTensors per rank, sharded over the world), the same for every path.

Phase "save" (one process set, so both paths save the same tensors; per
rep, ckptd's saves and s3torchconnector's one interleaved, the order
swapped every rep):
  1. ckptd, `--reps` timed saves (after `--warmup` untimed ones) alternating
     between the daemon without a remote tier ("off") and the one with
     `--remote s3://...` ("on"), the order swapped every rep; for each: the
     save call, STAGED (staging_completion), the local commit
     (upload_completion) and, "on", the remote commit (remote_completion),
     each in seconds from the call. The next save starts once the remote
     commit is in, so each upload is timed alone.
  2. ckptd "on", overlapped: in the first rep, right after the "on" save's
     local commit, one more save whose call and STAGED are timed while that
     checkpoint's upload runs, as in a training loop that saves more often
     than the tier takes a checkpoint.
  3. s3torchconnector: `--reps` timed torch.distributed.checkpoint.save with
     S3StorageWriter (after `--warmup`); the save returns once every object
     and .metadata are PUT (S3 acknowledges a PUT once durable).
Phase "restore" (fresh processes: a restarted trainer on a replacement
node): a template of the same structure holding zeros, then
  1. ckptd.torch.load("latest") through a fresh daemon with an empty --root
     and the same --remote (the remote tier alone holds the checkpoint);
  2. zeros again, torch.distributed.checkpoint.load with S3StorageReader of
     the last s3torchconnector checkpoint.
Each checks this rank's fingerprint against the saved one. Every figure is
per rank; the driver takes the slowest rank (a step waits for all).
"""

import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "peers"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import states  # noqa: E402

JOB = "bench"


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def server_cpu_s(o):
    """CPU seconds of the S3 server's processes so far (the driver names
    them), so that each save's share of the server's work is on record."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in o.get("server_pids", []):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:13]) / tick
    return total


def s3tc_config(o):
    from s3torchconnector import S3ClientConfig
    return S3ClientConfig(force_path_style=True, part_size=o["s3tc_part_size"])


def ckptd_save(ckpt, state, socket, name, remote, probe=None, o=None):
    t0 = time.perf_counter()
    r = ckpt.async_save(state, checkpoint_id=name, job=JOB, socket=socket)
    t1 = time.perf_counter()
    r.staging_completion.result()
    t2 = time.perf_counter()
    probed = probe() if probe is not None else None
    # Asked for only once STAGED, off the timed call: the future's waiting
    # thread starts then.
    remote_future = r.remote_completion if remote else None
    r.upload_completion.result()
    t3 = time.perf_counter()
    rec = {"call_s": t1 - t0, "staged_s": t2 - t0, "committed_s": t3 - t0}
    if o is not None:
        rec["server_cpu_at_commit"] = server_cpu_s(o)
    if probe is not None:
        rec["probe"] = probed
    return rec, remote_future, t0


def ckptd_rep(a, o, state, ckpt, rep, out):
    """One rep of the two ckptd daemons, the order swapped every rep."""
    sockets = {"off": o["socket_off"], "on": o["socket_on"]}
    order = ("off", "on") if rep % 2 == 0 else ("on", "off")
    rec = {}
    for variant in order:
        dist.barrier()
        c0, w0 = cpu_s(), server_cpu_s(o)
        r, fut, t0 = ckptd_save(ckpt, state, sockets[variant], f"ckpt-{rep:03d}",
                                variant == "on", o=o)
        if fut is not None and rep == 0:
            # Overlapped, on the first (untimed) save's upload: the next
            # save's call and STAGED while that upload runs, as in a
            # training loop that saves more often than the tier takes a
            # checkpoint. probe: whether the upload was still running
            # once the second save was STAGED (else it measured nothing).
            second, second_fut, _ = ckptd_save(
                ckpt, state, sockets["on"], "ckpt-overlap", True,
                probe=lambda: not fut.done())
            second["first_upload_running_at_staged"] = second.pop("probe")
            second_fut.result(timeout=o["remote_timeout_s"])
            out["ckptd_overlap"] = second
        if fut is not None:
            upload = fut.result(timeout=o["remote_timeout_s"])
            r["remote_committed_s"] = time.perf_counter() - t0
            r["remote_bytes"] = upload.get("bytes_total")
            r["remote_state"] = upload.get("state")
        r["rank_cpu_s"] = cpu_s() - c0
        dist.barrier()
        w1 = server_cpu_s(o)
        r["server_cpu_s"] = w1 - w0
        # The server's share of the upload alone: local commit -> remote commit.
        r["server_cpu_s_after_local_commit"] = w1 - r.pop("server_cpu_at_commit")
        rec[variant] = r
        dist.barrier()
    (out["ckptd"] if rep >= a.warmup else out["ckptd_warmup"]).append(rec)


def s3tc_rep(a, o, state, rep, out):
    """One torch.distributed.checkpoint.save through S3StorageWriter."""
    from s3torchconnector.dcp import S3StorageWriter
    import torch.distributed.checkpoint as dcp
    path = f"s3://{o['bucket']}/s3tc/ckpt-{rep:03d}"
    dist.barrier()
    c0, w0 = cpu_s(), server_cpu_s(o)
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=S3StorageWriter(
        o["region"], path, s3client_config=s3tc_config(o),
        thread_count=o["s3tc_threads"]))
    t1 = time.perf_counter()
    rec = {"durable_s": t1 - t0, "rank_cpu_s": cpu_s() - c0, "path": path}
    dist.barrier()
    rec["server_cpu_s"] = server_cpu_s(o) - w0
    (out["s3tc"] if rep >= a.warmup else out["s3tc_warmup"]).append(rec)


def save_phase(a, o, state):
    """ckptd's and s3torchconnector's reps interleaved, the order swapped
    every rep, so that a drift of the shared server's speed over the phase
    (it moved by a fifth within one run when every ckptd rep came first)
    falls on both paths alike."""
    import ckptd.torch as ckpt
    out = {"ckptd": [], "ckptd_warmup": [], "s3tc": [], "s3tc_warmup": []}
    for rep in range(a.warmup + a.reps):
        if rep % 2 == 0:
            ckptd_rep(a, o, state, ckpt, rep, out)
            s3tc_rep(a, o, state, rep, out)
        else:
            s3tc_rep(a, o, state, rep, out)
            ckptd_rep(a, o, state, ckpt, rep, out)
    dist.barrier()
    out["s3tc_last_path"] = f"s3://{o['bucket']}/s3tc/ckpt-{a.warmup + a.reps - 1:03d}"
    return out


def zero(state):
    for t in states.local_tensors(state):
        t.zero_()


def restore_phase(a, o, state, saved_fingerprint):
    import ckptd
    import ckptd.torch as ckpt
    out = {}
    dist.barrier()
    c0 = cpu_s()
    t0 = time.perf_counter()
    name = ckpt.load(state, checkpoint_id="latest", job=JOB, socket=o["socket_restore"])
    t1 = time.perf_counter()
    out["ckptd"] = {"restore_s": t1 - t0, "rank_cpu_s": cpu_s() - c0, "checkpoint": name,
                    "fingerprint_ok": states.fingerprint(state) == saved_fingerprint}
    dist.barrier()
    # Where the daemon served it from (untimed; ckptd.torch.load does not
    # say): one of this rank's tensors again through the low-level client.
    from ckptd.flatten import flatten
    leaves, _ = flatten(state)
    fqn, t = sorted(leaves.items())[0]
    client = ckptd.Client(JOB, a.rank, a.world, socket=o["socket_restore"])
    out["ckptd"]["source"] = client.load(name, {fqn: t})["source"]
    dist.barrier()

    from s3torchconnector.dcp import S3StorageReader
    import torch.distributed.checkpoint as dcp
    zero(state)
    dist.barrier()
    c0 = cpu_s()
    t0 = time.perf_counter()
    dcp.load(state, storage_reader=S3StorageReader(o["region"], o["s3tc_path"],
                                                   s3client_config=s3tc_config(o)))
    t1 = time.perf_counter()
    out["s3tc"] = {"load_s": t1 - t0, "rank_cpu_s": cpu_s() - c0, "path": o["s3tc_path"],
                   "fingerprint_ok": states.fingerprint(state) == saved_fingerprint}
    dist.barrier()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["save", "restore"], required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--layout", default="large")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--opts", required=True, help="JSON: sockets, bucket, region, ...")
    a = p.parse_args()
    o = json.loads(a.opts)
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=a.rank,
                            world_size=a.world)
    torch.set_num_threads(1)
    state, keep = states.build(a.layout, a.bytes, a.rank, a.world, fill=a.phase == "save")
    out = {"rank": a.rank, "local_bytes": states.local_bytes(state)}
    if a.phase == "save":
        out["fingerprint"] = states.fingerprint(state)
        out.update(save_phase(a, o, state))
    else:
        out.update(restore_phase(a, o, state, o["fingerprints"][a.rank]))
    dist.barrier()
    with open(a.out, "w") as f:
        json.dump(out, f)
    del keep
    # As the project's test ranks do (commit 01e4183): no gloo teardown in a
    # finalizing interpreter.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
