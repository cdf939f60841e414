"""The Python save call beside the C++ one, in one run.

Starts a ckptd on a temporary directory and times, with 1,000 float32
tensors of 16 KiB (16 MiB; the save call does not depend on the bytes):

  - ckpt-loadgen's save call (the C++ client: libckpt's Save with a layout),
    before and after the Python runs;
  - ckptd.torch.async_save with plain tensors, with DTensors on a 1-process
    gloo mesh, and Checkpointer.async_save (the layer below), each over
    --saves saves after a first, untimed one;
  - Checkpointer.async_save of the same tensors in GPU memory of the
    simulated device (the daemon runs with --gpu=simulated; each tensor
    its own storage, in 4 allocations): the call with its ready event,
    and the trainer's CPU blocked until the GPU-side STAGED
    (wait_staged_on_stream) returns. The copies are memcpy on the
    simulated streams, so only the CPU work of the path is real;
  - the same with a non-fused AdamW's host state beside it (a CPU `step`
    scalar per tensor, copied at the call into the package's snapshot
    buffers, and an `epoch` value);
  - both once as the package saves them (the stream waits for a relay
    record reserved at the call: no CPU wait for the submit thread's
    hand-over) and once without the relay, as before it (the CPU waits
    for the hand-over, then the stream for the daemon's staged record).

Each Python save is timed around the call alone (perf_counter_ns), and to
its STAGED (staging_completion: the daemon accepted the save and copied
every byte out, 16 MiB here; the Python package makes the replica exchange
and the save RPC on its submit thread after the call returned); then the
loop waits for the commit, untimed, as loadgen does. Garbage collections
are counted with gc.callbacks: those that started inside a save call (what
the save path triggers) and all of them during the loop; where none ran,
the growth of the collector's generation-0 count over the loop, per save,
says how many container objects each save leaves alive (0: no per-save
garbage for the collector to find). Prints one JSON object per measurement
and a summary line.

    .venv/bin/python bench/python_save_bench.py [--build build] [--saves 200]
                                                [--package DIR]
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TENSORS = 1000
SHAPE = (64, 64)  # float32: 16 KiB, above the copy threshold (saved in place)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class GcCounter:
    """Counts collections per generation, and those inside the timed call."""

    def __init__(self):
        self.in_call = False
        self.total = [0, 0, 0]
        self.during_call = [0, 0, 0]
        self.pause_ns = 0
        self._start = 0

    def __call__(self, phase, info):
        if phase == "start":
            self.total[info["generation"]] += 1
            if self.in_call:
                self.during_call[info["generation"]] += 1
            self._start = time.perf_counter_ns()
        else:
            self.pause_ns += time.perf_counter_ns() - self._start


def time_saves(name, save, saves, on_stream=False):
    """save(checkpoint_id) -> response; returns the figures of `saves` timed
    calls (`on_stream`: also the call plus the GPU-side STAGED)."""
    save("warm-0").upload_completion.result()  # plans, registers, defines the layout
    counter = GcCounter()
    gc.callbacks.append(counter)
    times, staged, blocked = [], [], []
    gen0_before = gc.get_count()[0]
    try:
        for i in range(1, saves + 1):
            counter.in_call = True
            t0 = time.perf_counter_ns()
            response = save(f"step-{i:06d}")
            t1 = time.perf_counter_ns()
            counter.in_call = False
            times.append((t1 - t0) / 1e6)
            if on_stream:
                response.wait_staged_on_stream()
                blocked.append((time.perf_counter_ns() - t0) / 1e6)
            response.staging_completion.result()
            staged.append((time.perf_counter_ns() - t0) / 1e6)
            response.upload_completion.result()
        gen0_after = gc.get_count()[0]
    finally:
        gc.callbacks.remove(counter)
    # Allocations minus deallocations of tracked objects since the last
    # collection: meaningful only when no collection ran in the loop.
    net = (round((gen0_after - gen0_before) / saves, 2)
           if sum(counter.total) == 0 else None)
    figures = {"measurement": name, "saves": saves, "tensors": TENSORS,
            "save_call_ms_p50": round(statistics.median(times), 3),
            "save_call_ms_p99": round(percentile(times, 99), 3),
            "save_call_ms_max": round(max(times), 3),
            "staged_ms_p50": round(statistics.median(staged), 3),
            "gc_collections_in_save_call": counter.during_call,
            "gc_collections_in_loop": counter.total,
            "gc_pause_ms_in_loop": round(counter.pause_ns / 1e6, 3),
            "gc_gen0_growth_per_save": net}
    if blocked:
        figures["blocked_to_gpu_staged_ms_p50"] = round(statistics.median(blocked), 3)
        figures["blocked_to_gpu_staged_ms_p99"] = round(percentile(blocked, 99), 3)
    return figures


def with_host_optimizer_state(state):
    """`state` plus a non-fused AdamW's host state: a CPU `step` scalar per
    tensor, and an `epoch` value."""
    import torch
    steps = {name: {"step": torch.tensor(1.0)} for name in state["model"]}
    return {"model": state["model"], "optim": {"state": steps}, "epoch": 1}


def without_relay(checkpointer):
    """Makes `checkpointer` plan its saves without a relay, as the package
    did before relays: wait_staged_on_stream() then waits on the CPU for
    the submit thread to hand the save over."""
    new_plan = checkpointer._new_plan

    def planned(state_dict):
        plan, keep, values = new_plan(state_dict)
        plan.relay = False
        return plan, keep, values
    checkpointer._new_plan = planned
    return checkpointer


def simulated_gpu_state(gpu):
    """TENSORS float32 tensors of SHAPE in memory of a SimulatedGpu, each
    over its own storage (as CUDA tensors of a model are), in 4
    allocations."""
    import ctypes
    import torch
    nbytes = SHAPE[0] * SHAPE[1] * 4
    per = TENSORS // 4
    state = {}
    for a in range(4):
        base = gpu.allocate(per * nbytes)
        for i in range(per):
            raw = (ctypes.c_uint8 * nbytes).from_address(base + i * nbytes)
            t = torch.frombuffer(raw, dtype=torch.float32).view(SHAPE)
            state[f"layer{a * per + i}.weight"] = t
    return {"model": state}


def loadgen(build, socket, job, saves):
    out = subprocess.run(
        [os.path.join(build, "bench", "ckpt-loadgen"), "--socket", socket, "--job", job,
         "--ranks", "1", "--tensors", str(TENSORS), "--bytes-per-rank",
         str(TENSORS * SHAPE[0] * SHAPE[1] * 4), "--saves", str(saves)],
        capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"measurement": f"cxx_loadgen_{job}", "saves": saves, "tensors": TENSORS,
            "save_call_ms_p50": r["save_call_ms_p50"], "save_call_ms_p99": r["save_call_ms_p99"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--build", default=os.path.join(here, "..", "build"))
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--loadgen-saves", type=int, default=60)
    parser.add_argument("--package", help="the directory holding the ckptd package "
                        "(default: BUILD/python); to time another version of it")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.abspath(args.package or os.path.join(build, "python")))
    import torch
    import torch.distributed as dist
    import ckptd
    import ckptd.torch as ckpt
    from ckptd.checkpointer import Checkpointer

    directory = tempfile.mkdtemp(prefix="ckptd-pybench-")
    socket = os.path.join(directory, "ckptd.sock")
    log = open(os.path.join(directory, "ckptd.log"), "w")
    daemon = subprocess.Popen(
        [os.path.join(build, "daemon", "ckptd"), "--socket", socket, "--root",
         os.path.join(directory, "root"), "--pool_bytes", str(256 << 20), "--keep_last", "2",
         "--max_sessions", "64", "--max_connections", "256", "--gpu=simulated"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(socket + ".session"):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ckptd did not start; see {log.name}")
            time.sleep(0.02)
        results = [loadgen(build, socket, "before", args.loadgen_saves)]
        print(json.dumps(results[-1]), flush=True)

        torch.manual_seed(0)
        plain = {"model": {f"layer{i}.weight": torch.randn(SHAPE) for i in range(TENSORS)}}
        results.append(time_saves("python_torch_async_save_plain", lambda c: ckpt.async_save(
            plain, checkpoint_id=c, job="plain", socket=socket), args.saves))
        print(json.dumps(results[-1]), flush=True)
        low = Checkpointer("checkpointer", socket=socket)
        results.append(time_saves("python_checkpointer_async_save_plain", lambda c: low.async_save(
            plain, checkpoint_id=c), args.saves))
        print(json.dumps(results[-1]), flush=True)
        del plain, low

        gpu = ckptd._ckpt.SimulatedGpu()
        on_gpu = simulated_gpu_state(gpu)
        mixed = with_host_optimizer_state(on_gpu)
        for state_name, state in (("", on_gpu), ("_host_state", mixed)):
            for relay_name, relay in (("", True), ("_without_relay", False)):
                job = f"gpu{state_name}{relay_name}"
                checkpointer = Checkpointer(job, socket=socket, gpu=gpu)
                if not relay:
                    without_relay(checkpointer)
                results.append(time_saves(
                    f"python_checkpointer_async_save_simulated_gpu{state_name}{relay_name}",
                    lambda c, k=checkpointer, s=state: k.async_save(s, checkpoint_id=c),
                    args.saves, on_stream=True))
                print(json.dumps(results[-1]), flush=True)
        gpu.synchronize()
        del on_gpu, mixed

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        dist.init_process_group("gloo", init_method=f"file://{directory}/gloo", rank=0,
                                world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        dtensors = {"model": {f"layer{i}.weight": distribute_tensor(torch.randn(SHAPE), mesh,
                                                                    [Shard(0)])
                              for i in range(TENSORS)}}
        results.append(time_saves("python_torch_async_save_dtensor", lambda c: ckpt.async_save(
            dtensors, checkpoint_id=c, job="dtensor", socket=socket), args.saves))
        print(json.dumps(results[-1]), flush=True)
        dist.destroy_process_group()

        results.append(loadgen(build, socket, "after", args.loadgen_saves))
        print(json.dumps(results[-1]), flush=True)
        print(json.dumps({r["measurement"]: [r["save_call_ms_p50"], r["save_call_ms_p99"]]
                          for r in results}))
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
