"""ckptd's remote tier against what a user would pick instead, in one run on
one S3 server (issue 30, item 9). See bench/remote/README.md.

In this order, against one SeaweedFS started here (loopback, its data on
local disk under --dir):
  1. save phase (worker.py, --world fresh rank processes): ckptd saves
     alternating between a daemon without a remote tier and one with
     `--remote s3://BUCKET/ckptd` (save call, STAGED, local commit, remote
     commit), one overlapped save, then s3torchconnector's DCP writer;
  2. restore phase (fresh rank processes): ckptd.torch.load through a fresh
     daemon with an empty --root (remote tier only), then s3torchconnector's
     DCP reader;
  3. raw clients on the same bytes (the files of ckptd's last checkpoint in
     the "on" daemon's root): boto3 with TransferConfig (multipart chunk
     size, max_concurrency) upload and ranged-GET download, and s5cmd cp up
     and down (--numworkers, --concurrency, --part-size), each over a small
     grid of settings; the best per client and direction is kept.
Writes results/remote-<time>.json (and latest.json) and prints the table.

    bench/remote/run.sh [--bytes 1G] [--world 2] [--reps 2] ...
"""

import argparse
import glob
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

MiB, GiB = 1 << 20, 1 << 30
ACCESS_KEY, SECRET_KEY = "benchaccess", "benchsecret0123456789"
BUCKET = "bench"
REGION = "us-east-1"


def parse_size(s):
    s = s.strip().upper()
    for suffix, mult in (("G", GiB), ("M", MiB), ("K", 1024)):
        if s.endswith(suffix):
            return int(float(s[:-1]) * mult)
    return int(s)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def proc_cpu_s(pid):
    """utime + stime of a process and its reaped children, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / tick


def tree_cpu_s(pid):
    """CPU seconds of a process and all its live descendants."""
    total = proc_cpu_s(pid) or 0.0
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                             text=True).stdout.split()
    except OSError:
        out = []
    for child in out:
        total += tree_cpu_s(int(child))
    return total


def find_bin_dir(arg):
    for d in ([arg] if arg else [os.path.join(REPO, "build"), os.path.join(REPO, "build-nocuda")]):
        for daemon in ("ckptd", "daemon/ckptd"):
            if os.path.isfile(os.path.join(d, daemon)):
                return os.path.abspath(d), os.path.join(os.path.abspath(d), daemon)
    sys.exit(f"no ckptd binary under {arg or 'build/ or build-nocuda/'} (build first)")


def find_tool(name):
    for d in (os.path.dirname(sys.executable), os.path.join(REPO, ".venv", "bin")):
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if not found:
        sys.exit(f"{name} missing: pip install -r scripts/requirements-bench-remote.txt")
    return found


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


class Perf:
    """`perf record` of one process (--profile: where the daemon's and the
    server's time goes), reported as the top symbols, self time."""

    def __init__(self, pid, path):
        self.path = path
        self.proc = subprocess.Popen(["perf", "record", "-F", "199", "-g", "-p", str(pid),
                                      "-o", path], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def stop(self, top=40):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out = {}
        for name, sort in (("by_dso", "dso"), ("by_symbol", "dso,symbol")):
            r = subprocess.run(["perf", "report", "-i", self.path, "--stdio", "--no-children",
                                "--sort", sort, "-g", "none", "--percent-limit", "0.5"],
                               capture_output=True, text=True)
            out[name] = [" ".join(l.split()) for l in r.stdout.splitlines()
                         if l.strip() and not l.startswith("#")][:top]
        return out


# ---- the S3 server ------------------------------------------------------------

class SeaweedFs:
    """`weed server` with master, volume, filer and S3 gateway on loopback
    (the command line of tests/s3/seaweedfs_fixture.cc, with volumes large
    enough for the benchmark)."""

    def __init__(self, weed, dir):
        self.dir = dir
        data = os.path.join(dir, "data")
        os.makedirs(data)
        config = os.path.join(dir, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [{"name": "bench", "credentials": [
                {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, f)
        p = free_ports(8)
        self.port = p[6]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(dir, "weed.log")
        self.log = open(self.log_path, "w")
        self.cmd = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                    "-master.telemetry=false", "-master.volumeSizeLimitMB=1024",
                    "-volume.max=64", f"-master.port={p[0]}", f"-master.port.grpc={p[1]}",
                    f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}", "-filer",
                    f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3",
                    f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0",
                    "-s3.port.lance=0", f"-s3.config={config}"]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_bucket(self, client, bucket, timeout=90):
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited: {open(self.log_path).read()[-3000:]}")
            try:
                client.create_bucket(Bucket=bucket)
                return
            except Exception as e:  # noqa: BLE001 - not up yet
                if type(e).__name__ == "BucketAlreadyOwnedByYou":
                    return
                if time.time() > deadline:
                    raise RuntimeError(f"SeaweedFS did not come up: {e}; "
                                       f"{open(self.log_path).read()[-3000:]}")
                time.sleep(0.3)

    def cpu_s(self):
        return tree_cpu_s(self.proc.pid)

    def pids(self):
        """The server's process and its descendants (the ranks sample
        their CPU per save)."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)],
                                 capture_output=True, text=True).stdout.split()
            todo.extend(int(c) for c in out)
        return found

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# ---- ckptd ------------------------------------------------------------------------

class Daemon:
    def __init__(self, binary, dir, flags):
        os.makedirs(dir, exist_ok=True)
        self.socket = os.path.join(dir, "ckptd.sock")
        self.root = os.path.join(dir, "root")
        self.log_path = os.path.join(dir, "ckptd.log")
        self.cmd = [binary, "--socket", self.socket, "--root", self.root] + flags
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(self.socket + ".session"):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"ckptd did not start: {open(self.log_path).read()[-2000:]}")
            time.sleep(0.05)

    def cpu_s(self):
        return proc_cpu_s(self.proc.pid)

    def wait_for_log(self, text, timeout):
        """Seconds until a line with `text` is in the log, or None after `timeout`."""
        start = time.time()
        while time.time() - start < timeout:
            with open(self.log_path) as f:
                if any(text in line for line in f):
                    return time.time() - start
            time.sleep(0.05)
        return None

    def remote_log_lines(self):
        with open(self.log_path) as f:
            return [line.strip() for line in f if "remote tier" in line]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_ranks(a, env, phase, dir, opts, tag=""):
    """`tag` names a second set of ranks of the same phase (a fresh gloo store)."""
    store = os.path.join(dir, f"gloo-{phase}{tag}")
    outs = [os.path.join(dir, f"{phase}{tag}-rank{r}.json") for r in range(a.world)]
    logs = [open(os.path.join(dir, f"{phase}{tag}-rank{r}.log"), "w") for r in range(a.world)]
    cmd = lambda r: [sys.executable, os.path.join(HERE, "worker.py"), "--phase", phase,
                     "--rank", str(r), "--world", str(a.world), "--layout", a.layout,
                     "--bytes", str(a.bytes), "--store", store, "--out", outs[r],
                     "--reps", str(a.reps), "--warmup", str(a.warmup),
                     "--opts", json.dumps(opts)]
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
                p.wait()
    for f in logs:
        f.close()
    if failed or any(p.returncode != 0 for p in procs):
        tails = "".join(open(f.name).read()[-3000:] for f in logs)
        raise RuntimeError(f"{failed or phase + ' failed'}\n{tails}")
    return [json.load(open(o)) for o in outs]


# ---- raw clients ----------------------------------------------------------------------

def boto3_client(endpoint, max_pool):
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=max_pool,
                      retries={"max_attempts": 3, "mode": "standard"}))


def delete_prefix(client, prefix):
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


def run_boto3(endpoint, files, dir, chunk, conc, weed):
    """Upload every file (one TransferManager: all files share max_concurrency
    threads; multipart parts of `chunk`), then download them (ranged GETs of
    `chunk`, max_concurrency at once) into files under `dir`."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    client = boto3_client(endpoint, conc + 4)
    config = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk,
                            max_concurrency=conc, use_threads=True)
    prefix = f"boto3-{chunk // MiB}-{conc}/"
    out = {"chunk_bytes": chunk, "max_concurrency": conc}

    def timed(fn):
        c0, w0 = _self_cpu(), weed.cpu_s()
        t0 = time.perf_counter()
        fn()
        return {"seconds": time.perf_counter() - t0, "client_cpu_s": _self_cpu() - c0,
                "server_cpu_s": weed.cpu_s() - w0}

    def up():
        with create_transfer_manager(client, config) as tm:
            futures = [tm.upload(f, BUCKET, prefix + os.path.basename(f)) for f in files]
            for fut in futures:
                fut.result()

    dl = os.path.join(dir, "dl-boto3")
    os.makedirs(dl, exist_ok=True)

    def down():
        with create_transfer_manager(client, config) as tm:
            futures = [tm.download(BUCKET, prefix + os.path.basename(f),
                                   os.path.join(dl, os.path.basename(f))) for f in files]
            for fut in futures:
                fut.result()

    out["upload"] = timed(up)
    out["download"] = timed(down)
    _check_same(files, dl)
    shutil.rmtree(dl)
    delete_prefix(client, prefix)
    return out


def _self_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _check_same(files, dir):
    for f in files:
        got = os.path.join(dir, os.path.basename(f))
        if os.path.getsize(got) != os.path.getsize(f):
            raise RuntimeError(f"downloaded {got}: {os.path.getsize(got)} bytes, "
                               f"want {os.path.getsize(f)}")


def run_s5cmd(s5cmd, endpoint, src_dir, files, dir, workers, conc, part_mib, weed):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_REGION=REGION)
    base = [s5cmd, "--endpoint-url", endpoint, "--numworkers", str(workers)]
    prefix = f"s3://{BUCKET}/s5cmd-{workers}-{conc}-{part_mib}/"
    stage = os.path.join(dir, "s5-src")  # just the data files, by hard link
    os.makedirs(stage, exist_ok=True)
    for f in files:
        os.link(f, os.path.join(stage, os.path.basename(f)))
    dl = os.path.join(dir, "dl-s5cmd")
    os.makedirs(dl, exist_ok=True)
    out = {"numworkers": workers, "concurrency": conc, "part_size_mib": part_mib}

    def timed(args):
        c0, w0 = _children_cpu(), weed.cpu_s()
        t0 = time.perf_counter()
        r = subprocess.run(base + args, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"s5cmd {' '.join(args)}: {r.stderr[-2000:]}{r.stdout[-2000:]}")
        return {"seconds": seconds, "client_cpu_s": _children_cpu() - c0,
                "server_cpu_s": weed.cpu_s() - w0}

    out["upload"] = timed(["cp", "--concurrency", str(conc), "--part-size", str(part_mib),
                           os.path.join(stage, "*"), prefix])
    out["download"] = timed(["cp", "--concurrency", str(conc), "--part-size", str(part_mib),
                             prefix + "*", dl + "/"])
    _check_same(files, dl)
    shutil.rmtree(dl)
    shutil.rmtree(stage)
    subprocess.run(base + ["rm", prefix + "*"], env=env, capture_output=True)
    return out


def repeated(run, reps):
    """`run` (one raw client's upload and download at one setting) `reps`
    times; each figure the median of its reps, as ckptd's are, so that the
    best setting is not picked by one lucky run (the best of four single
    runs sits about one spread below their middle)."""
    runs = [run() for _ in range(reps)]
    out = {k: v for k, v in runs[0].items() if k not in ("upload", "download")}
    for direction in ("upload", "download"):
        out[direction] = {k: med([r[direction][k] for r in runs])
                          for k in ("seconds", "client_cpu_s", "server_cpu_s")}
        out[direction]["seconds_reps"] = [r[direction]["seconds"] for r in runs]
    return out


def flag_value(flags, name):
    """The value `flags` give `name` (as "--name V" or "--name=V"), else None."""
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return None


def grid(spec, n):
    rows = []
    for item in spec.split(","):
        parts = item.split(":")
        if len(parts) != n:
            sys.exit(f"bad grid entry {item!r}: {n} numbers separated by ':'")
        rows.append([int(x) for x in parts])
    return rows


# ---- the run -----------------------------------------------------------------------------

def slowest(values):
    return max(values)


def med(values):
    return statistics.median(values) if values else None


def summarize(a, saves, restores, raw, nbytes, daemon_on_cpu):
    """Per rep the slowest rank; then the median over reps."""
    s = {}
    reps = len(saves[0]["ckptd"])
    for variant in ("off", "on"):
        for field in ("call_s", "staged_s", "committed_s", "remote_committed_s"):
            per_rep = []
            for i in range(reps):
                vals = [r["ckptd"][i][variant].get(field) for r in saves]
                if None not in vals:
                    per_rep.append(slowest(vals))
            if per_rep:
                s[f"ckptd_{variant}_{field}"] = med(per_rep)
                s[f"ckptd_{variant}_{field}_reps"] = per_rep
    s["ckptd_on_upload_after_local_commit_s"] = med(
        [max(r["ckptd"][i]["on"]["remote_committed_s"] for r in saves)
         - max(r["ckptd"][i]["on"]["committed_s"] for r in saves) for i in range(reps)])
    ovl = [r["ckptd_overlap"] for r in saves]
    s["ckptd_overlap_call_s"] = slowest([o["call_s"] for o in ovl])
    s["ckptd_overlap_staged_s"] = slowest([o["staged_s"] for o in ovl])
    s["ckptd_overlap_upload_running"] = all(o["first_upload_running_at_staged"] for o in ovl)
    s["s3tc_durable_s"] = med([slowest([r["s3tc"][i]["durable_s"] for r in saves])
                               for i in range(len(saves[0]["s3tc"]))])
    s["s3tc_durable_s_reps"] = [slowest([r["s3tc"][i]["durable_s"] for r in saves])
                                for i in range(len(saves[0]["s3tc"]))]
    # The server's CPU per save, sampled by rank 0 around each one (with
    # the barriers after it, so the server's work for it is in).
    s["server_cpu_s_per_ckptd_remote_save"] = med(
        [rep["on"]["server_cpu_s"] for rep in saves[0]["ckptd"]])
    s["server_cpu_s_per_ckptd_upload"] = med(
        [rep["on"]["server_cpu_s_after_local_commit"] for rep in saves[0]["ckptd"]])
    s["server_cpu_s_per_s3tc_save"] = med([rep["server_cpu_s"] for rep in saves[0]["s3tc"]])
    s["s3tc_ranks_cpu_s_per_save"] = med([sum(r["s3tc"][i]["rank_cpu_s"] for r in saves)
                                          for i in range(len(saves[0]["s3tc"]))])
    # Restores: `restores` holds a list of ranks per rep (each rep a fresh
    # daemon and fresh ranks); per rep the slowest rank, then the median.
    s["s3tc_ranks_cpu_s_load"] = med([sum(r["s3tc"]["rank_cpu_s"] for r in rs)
                                      for rs in restores])
    s["ckptd_restore_s_reps"] = [slowest([r["ckptd"]["restore_s"] for r in rs])
                                 for rs in restores]
    s["ckptd_restore_s"] = med(s["ckptd_restore_s_reps"])
    s["ckptd_restore_sources"] = sorted({r["ckptd"]["source"] for rs in restores for r in rs})
    s["s3tc_load_s_reps"] = [slowest([r["s3tc"]["load_s"] for r in rs]) for rs in restores]
    s["s3tc_load_s"] = med(s["s3tc_load_s_reps"])
    s["restores_verified"] = all(r["ckptd"]["fingerprint_ok"] and r["s3tc"]["fingerprint_ok"]
                                 for rs in restores for r in rs)
    for client, runs in raw.items():
        for direction in ("upload", "download"):
            best = min(runs, key=lambda x: x[direction]["seconds"])
            s[f"{client}_{direction}_s"] = best[direction]["seconds"]
            s[f"{client}_{direction}_cpu_s"] = [best[direction]["client_cpu_s"],
                                                best[direction]["server_cpu_s"]]
            s[f"{client}_{direction}_config"] = {k: v for k, v in best.items()
                                                  if k not in ("upload", "download")}
    for direction in ("upload", "download"):
        best = min(raw, key=lambda c: s[f"{c}_{direction}_s"])
        s[f"best_raw_{direction}"] = best
        s[f"best_raw_{direction}_s"] = s[f"{best}_{direction}_s"]
    gbps = lambda sec: nbytes / sec / 1e9
    # ckptd's upload rate: the bytes the remote tier took, over the time from
    # the local commit to the remote commit (the upload itself).
    s["ckptd_upload_GBps"] = gbps(s["ckptd_on_upload_after_local_commit_s"])
    s["ckptd_restore_GBps"] = gbps(s["ckptd_restore_s"])
    s["best_raw_upload_GBps"] = gbps(s["best_raw_upload_s"])
    s["best_raw_download_GBps"] = gbps(s["best_raw_download_s"])
    s["ratios"] = {
        "remote_commit_vs_s3tc_durable": {
            "value": s["s3tc_durable_s"] / s["ckptd_on_remote_committed_s"], "target": 1.0,
            "what": "s3torchconnector DCP writer's time to durable / ckptd's time from the "
                    "save call to the remote commit"},
        "upload_rate_vs_best_raw": {
            "value": s["ckptd_upload_GBps"] / s["best_raw_upload_GBps"], "target": 0.9,
            "what": "ckptd upload rate (local commit -> remote commit) / best raw client's "
                    "upload rate"},
        "remote_restore_vs_best_raw_get": {
            "value": s["ckptd_restore_GBps"] / s["best_raw_download_GBps"], "target": 0.9,
            "what": "ckptd restore rate from the remote tier / best raw client's ranged-GET "
                    "download rate"},
        "save_call_on_vs_off": {
            "value": s["ckptd_on_call_s"] / s["ckptd_off_call_s"], "target": None,
            "what": "save call with --remote / without (1.0: unchanged)"},
        "staged_on_vs_off": {
            "value": s["ckptd_on_staged_s"] / s["ckptd_off_staged_s"], "target": None,
            "what": "STAGED with --remote / without (1.0: unchanged)"},
        "staged_during_upload_vs_off": {
            "value": s["ckptd_overlap_staged_s"] / s["ckptd_off_staged_s"], "target": None,
            "what": "STAGED of a save made while the previous checkpoint uploads / without "
                    "--remote"},
    }
    s["daemon_on_cpu_s"] = daemon_on_cpu
    return s


def table(s, nbytes):
    gb = nbytes / 1e9
    rate = lambda sec: f"{gb / sec:.3f}" if sec else ""
    cpu = {  # client CPU seconds of the path (server CPU in the JSON)
        "ckptd, --remote: upload (local commit -> remote commit)":
            s.get("daemon_cpu_s_per_upload_est"),
        "s3torchconnector DCP writer: time to durable": s.get("s3tc_ranks_cpu_s_per_save"),
        "ckptd restore, fresh daemon, empty --root (remote tier)": s.get("daemon_cpu_s_restore"),
        "s3torchconnector DCP reader: load": s.get("s3tc_ranks_cpu_s_load"),
    }
    rows = [
        ("ckptd, no --remote: save call", s["ckptd_off_call_s"], ""),
        ("ckptd, no --remote: STAGED", s["ckptd_off_staged_s"], ""),
        ("ckptd, no --remote: local commit", s["ckptd_off_committed_s"],
         rate(s["ckptd_off_committed_s"])),
        ("ckptd, --remote: save call", s["ckptd_on_call_s"], ""),
        ("ckptd, --remote: STAGED", s["ckptd_on_staged_s"], ""),
        ("ckptd, --remote: save call while the previous upload runs", s["ckptd_overlap_call_s"],
         ""),
        ("ckptd, --remote: STAGED while the previous upload runs", s["ckptd_overlap_staged_s"],
         ""),
        ("ckptd, --remote: local commit", s["ckptd_on_committed_s"],
         rate(s["ckptd_on_committed_s"])),
        ("ckptd, --remote: remote commit (from the call)", s["ckptd_on_remote_committed_s"],
         rate(s["ckptd_on_remote_committed_s"])),
        ("ckptd, --remote: upload (local commit -> remote commit)",
         s["ckptd_on_upload_after_local_commit_s"], rate(s["ckptd_on_upload_after_local_commit_s"])),
        ("s3torchconnector DCP writer: time to durable", s["s3tc_durable_s"],
         rate(s["s3tc_durable_s"])),
    ]
    for client in ("boto3", "s5cmd"):
        if f"{client}_upload_s" in s:
            rows.append((f"{client} upload (best: {_cfg(s[client + '_upload_config'])})",
                         s[f"{client}_upload_s"], rate(s[f"{client}_upload_s"])))
    rows += [
        ("ckptd restore, fresh daemon, empty --root (remote tier)", s["ckptd_restore_s"],
         rate(s["ckptd_restore_s"])),
        ("s3torchconnector DCP reader: load", s["s3tc_load_s"], rate(s["s3tc_load_s"])),
    ]
    for client in ("boto3", "s5cmd"):
        if f"{client}_download_s" in s:
            rows.append((f"{client} ranged-GET download (best: "
                         f"{_cfg(s[client + '_download_config'])})",
                         s[f"{client}_download_s"], rate(s[f"{client}_download_s"])))
    for client in ("boto3", "s5cmd"):
        for direction, label in (("upload", "upload"), ("download", "ranged-GET download")):
            for name, _, _ in rows:
                if name.startswith(f"{client} {label} (best"):
                    cpu[name] = s.get(f"{client}_{direction}_cpu_s", [None])[0]
    c = lambda name: f"{cpu[name]:.2f}" if cpu.get(name) is not None else ""
    lines = ["| path | time (s) | GB/s | client CPU (s) |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {_sec(sec)} | {r} | {c(name)} |" for name, sec, r in rows]
    lines += ["", "| ratio | value | target | met |", "| --- | ---: | ---: | --- |"]
    for key, r in s["ratios"].items():
        target = r["target"]
        met = "" if target is None else ("yes" if r["value"] >= target else "**no**")
        lines.append(f"| {r['what']} | {r['value']:.2f} | "
                     f"{'≥ %.1f' % target if target else '1.0 within noise'} | {met} |")
    return "\n".join(lines)


def _sec(sec):
    return f"{sec * 1000:.2f} ms" if sec < 0.1 else f"{sec:.2f}"


def _cfg(c):
    if "chunk_bytes" in c:
        return f"chunk {c['chunk_bytes'] // MiB} MiB, max_concurrency {c['max_concurrency']}"
    return (f"--numworkers {c['numworkers']} --concurrency {c['concurrency']} "
            f"--part-size {c['part_size_mib']}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=parse_size, default=parse_size("1G"),
                   help="the state's total size over all ranks (default 1G)")
    p.add_argument("--world", type=int, default=2, help="trainer ranks (gloo, CPU)")
    p.add_argument("--layout", default="large", choices=["large", "small"],
                   help="bench/peers/states.py layout (large: 8 tensors per rank)")
    p.add_argument("--reps", type=int, default=5, help="timed saves per path")
    p.add_argument("--warmup", type=int, default=1, help="untimed saves per path first")
    p.add_argument("--boto3", default="64:8,16:16",
                   help="boto3 TransferConfig grid: CHUNK_MIB:MAX_CONCURRENCY,...")
    p.add_argument("--s5cmd", default="8:8:64,16:4:16",
                   help="s5cmd grid: NUMWORKERS:CONCURRENCY:PART_MIB,...")
    p.add_argument("--raw-reps", type=int, default=3,
                   help="runs of each raw client setting (the median counts)")
    p.add_argument("--restore-reps", type=int, default=3,
                   help="restores per path, each by a fresh daemon and fresh ranks")
    p.add_argument("--s3tc-threads", type=int, default=1,
                   help="S3StorageWriter thread_count (1: its and DCP's default)")
    p.add_argument("--s3tc-part-size", type=parse_size, default=parse_size("8M"),
                   help="S3ClientConfig part_size (8M: its default)")
    p.add_argument("--daemon-flags", default="",
                   help="more flags for the daemons with --remote (e.g. "
                        "'--remote_max_bytes_per_second 0')")
    p.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    p.add_argument("--bin-dir", help="build directory holding daemon/ckptd and python/")
    p.add_argument("--keep", action="store_true", help="keep --dir")
    p.add_argument("--phase-timeout", type=int, default=900)
    p.add_argument("--profile", action="store_true",
                   help="diagnostic: perf record the daemon with --remote and SeaweedFS "
                        "during the save phase, and the restoring daemon during the restore; "
                        "top symbols into the JSON")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="where the JSON goes")
    a = p.parse_args()

    if a.warmup < 1:
        sys.exit("--warmup must be 1 or more: the overlapped save rides on the first upload")
    bin_dir, binary = find_bin_dir(a.bin_dir)
    weed_bin, s5cmd = find_tool("weed"), find_tool("s5cmd")
    dir = a.dir or tempfile.mkdtemp(prefix="ckptd-remote-bench-")
    os.makedirs(dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(bin_dir, "python")] + [os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep),
        AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION)
    creds = os.path.join(dir, "credentials")
    with open(creds, "w") as f:
        f.write(f"[default]\naws_access_key_id = {ACCESS_KEY}\n"
                f"aws_secret_access_key = {SECRET_KEY}\n")
    os.chmod(creds, 0o600)
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "loadavg_start": loadavg()},
              "args": {k: v for k, v in vars(a).items()}, "bin_dir": bin_dir}
    try:
        result["git"] = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    weed = SeaweedFs(weed_bin, os.path.join(dir, "weed"))
    daemons = []
    t_start = time.time()
    try:
        s3 = boto3_client(weed.endpoint, 10)
        weed.wait_bucket(s3, BUCKET)
        env["AWS_ENDPOINT_URL"] = weed.endpoint  # s3torchconnector's client reads it
        log(f"SeaweedFS up at {weed.endpoint}; state {a.bytes / GiB:.2f} GiB over "
            f"{a.world} ranks; daemon {binary}")
        pool = str(a.bytes + 64 * MiB)
        base = ["--pool_bytes", pool, "--keep_last", "2", "--max_sessions", "256",
                "--max_connections", "1024"]
        remote = ["--remote", f"s3://{BUCKET}/ckptd", "--remote_endpoint", weed.endpoint,
                  "--remote_region", REGION, "--remote_addressing", "path",
                  "--remote_credentials_file", creds] + a.daemon_flags.split()
        off = Daemon(binary, os.path.join(dir, "daemon-off"), base)
        daemons.append(off)
        on = Daemon(binary, os.path.join(dir, "daemon-on"), base + remote)
        daemons.append(on)
        result["daemon_flags"] = {"off": base, "on": base + remote}
        opts = {"socket_off": off.socket, "socket_on": on.socket, "bucket": BUCKET,
                "region": REGION, "remote_timeout_s": 600, "s3tc_threads": a.s3tc_threads,
                "s3tc_part_size": a.s3tc_part_size, "server_pids": weed.pids()}
        log("save phase: ckptd without and with --remote, and s3torchconnector's writer, "
            "interleaved")
        on_cpu0, off_cpu0, weed_cpu0 = on.cpu_s(), off.cpu_s(), weed.cpu_s()
        perfs = [Perf(on.proc.pid, os.path.join(dir, "perf-daemon-on.data")),
                 Perf(weed.proc.pid, os.path.join(dir, "perf-weed.data"))] if a.profile else []
        saves = run_ranks(a, env, "save", dir, opts)
        if perfs:
            result["profile_save_phase"] = {"daemon_on": perfs[0].stop(),
                                            "weed": perfs[1].stop()}
        result["saves"] = saves
        result["daemon_on_cpu_s_save_phase"] = on.cpu_s() - on_cpu0
        result["daemon_off_cpu_s_save_phase"] = off.cpu_s() - off_cpu0
        result["weed_cpu_s_save_phase"] = weed.cpu_s() - weed_cpu0
        result["daemon_on_remote_log"] = on.remote_log_lines()[-20:]
        # The bytes the raw clients move: the data files of ckptd's newest
        # local checkpoint (what the remote tier uploaded).
        last = f"ckpt-{a.warmup + a.reps - 1:03d}"
        newest = glob.glob(os.path.join(on.root, "**", last), recursive=True)[0]
        files = sorted(f for f in glob.glob(os.path.join(newest, "**"), recursive=True)
                       if os.path.isfile(f) and os.path.getsize(f) >= MiB)
        nbytes = sum(os.path.getsize(f) for f in files)
        result["raw_files"] = [[os.path.relpath(f, newest), os.path.getsize(f)] for f in files]
        result["bytes_moved"] = nbytes
        result["remote_bytes_reported"] = saves[0]["ckptd"][0]["on"].get("remote_bytes")
        off.stop()
        log(f"raw clients on ckptd's {len(files)} data files ({nbytes / GiB:.2f} GiB)")
        raw = {"boto3": [], "s5cmd": []}
        for chunk_mib, conc in grid(a.boto3, 2):
            raw["boto3"].append(repeated(lambda: run_boto3(
                weed.endpoint, files, dir, chunk_mib * MiB, conc, weed), a.raw_reps))
            log(f"  boto3 chunk {chunk_mib} MiB x{conc}: up "
                f"{raw['boto3'][-1]['upload']['seconds']:.2f} s, down "
                f"{raw['boto3'][-1]['download']['seconds']:.2f} s")
        for workers, conc, part in grid(a.s5cmd, 3):
            raw["s5cmd"].append(repeated(lambda: run_s5cmd(
                s5cmd, weed.endpoint, newest, files, dir, workers, conc, part, weed), a.raw_reps))
            log(f"  s5cmd workers {workers} conc {conc} part {part} MiB: up "
                f"{raw['s5cmd'][-1]['upload']['seconds']:.2f} s, down "
                f"{raw['s5cmd'][-1]['download']['seconds']:.2f} s")
        result["raw"] = raw
        on.stop()
        log(f"restore phase, {a.restore_reps} times: a fresh daemon with an empty --root, "
            "then s3torchconnector's reader")
        opts.update(s3tc_path=saves[0]["s3tc_last_path"],
                    fingerprints=[r["fingerprint"] for r in saves])
        restores, windows_s, restore_cpu, weed_cpu_restore = [], [], [], 0.0
        # --remote_fetch_resident_bytes 0 (in --daemon-flags): no windows to wait for.
        resident_windows = flag_value(a.daemon_flags.split(),
                                      "--remote_fetch_resident_bytes") != "0"
        for rep in range(a.restore_reps):
            # Each rep a replacement node: a fresh daemon on an empty root,
            # fresh rank processes.
            fresh = Daemon(binary, os.path.join(dir, f"daemon-restore-{rep}"), base + remote)
            daemons.append(fresh)
            # A replacement node's daemon is up before its job restores
            # (systemd starts it at boot, the Slurm launcher before the
            # trainers), so its resident fetch windows
            # (--remote_fetch_resident_bytes) are faulted in by then: the
            # ranks start once they are, rather than racing them on these
            # two cores (docs/BENCHMARKS.md, "Resident fetch windows").
            windows_s.append(fresh.wait_for_log("bytes of fetch windows faulted in", 30)
                             if resident_windows else None)
            opts.update(socket_restore=fresh.socket)
            fresh_cpu0, weed_cpu0 = fresh.cpu_s(), weed.cpu_s()
            perf = (Perf(fresh.proc.pid, os.path.join(dir, "perf-restore.data"))
                    if a.profile and rep == 0 else None)
            restores.append(run_ranks(a, env, "restore", dir, opts, tag=f"-{rep}"))
            if perf:
                result["profile_restore_phase"] = {"daemon_restore": perf.stop()}
            restore_cpu.append(fresh.cpu_s() - fresh_cpu0)
            weed_cpu_restore += weed.cpu_s() - weed_cpu0
            fresh.stop()
        result["restore_daemon_windows_resident_s"] = windows_s
        result["restores"] = restores
        result["daemon_restore_cpu_s"] = med(restore_cpu)
        result["weed_cpu_s_restore_phase"] = weed_cpu_restore
        s = summarize(a, saves, restores, raw, nbytes, result["daemon_on_cpu_s_save_phase"])
        # The daemon's CPU per upload: the "on" daemon saved reps + 2 times
        # (warm-up, overlapped, timed) and uploaded each; the "off" one saved
        # reps + 1 times. The difference, per upload, is the upload's.
        n_on, n_off = a.reps + a.warmup + 1, a.reps + a.warmup
        s["daemon_cpu_s_per_upload_est"] = (
            result["daemon_on_cpu_s_save_phase"]
            - result["daemon_off_cpu_s_save_phase"] * n_on / n_off) / n_on
        s["daemon_cpu_s_per_save_est"] = result["daemon_off_cpu_s_save_phase"] / n_off
        s["daemon_cpu_s_restore"] = result["daemon_restore_cpu_s"]
        result["summary"] = s
        result["machine"]["loadavg_end"] = loadavg()
        result["wall_s"] = time.time() - t_start
        text = table(s, nbytes)
        result["table_md"] = text
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, time.strftime("remote-%Y%m%d-%H%M%S.json"))
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        shutil.copyfile(path, os.path.join(a.out, "latest.json"))
        print()
        print(f"state {a.bytes / GiB:.2f} GiB over {a.world} ranks ({a.layout}); "
              f"{nbytes / 1e9:.3f} GB moved per path; reps {a.reps} (+{a.warmup} warm-up); "
              f"restores verified: {s['restores_verified']}; ckptd restore source: "
              f"{', '.join(s['ckptd_restore_sources'])}; load average "
              f"{' '.join(result['machine']['loadavg_start'])} -> "
              f"{' '.join(result['machine']['loadavg_end'])}")
        print(text)
        print(f"\nJSON: {path}  (wall {result['wall_s']:.0f} s)")
        print(json.dumps({"summary": {k: v for k, v in s.items() if not k.endswith("_reps")}},
                         indent=1, default=str))
        if not s["restores_verified"]:
            sys.exit("a restore did not give back the saved tensors")
    finally:
        for d in daemons:
            d.stop()
        weed.stop()
        if not a.keep:
            shutil.rmtree(dir, ignore_errors=True)


if __name__ == "__main__":
    main()
