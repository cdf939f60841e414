"""ckptd.torch with CUDA tensors from two processes, on a GPU machine: a
DDP-style state (replicated parameters, AdamW's state, a per-rank tensor,
a non-contiguous view) saved with the GPU-side STAGED while the next
optimizer step is queued at once, a second save that reuses the plan, and
a load back into the same tensors; with PyTorch's caching allocator on
plain cudaMalloc segments and on expandable segments (CUDA virtual memory,
shared with the daemon as POSIX-FD handles).

Run as: python test_torch_cuda.py (in this directory), with PYTHONPATH
holding the built package (built with CUDA) and CKPTD_BINARY the daemon.
Exits 77, which ctest reports as skipped, where torch sees no CUDA device.
"""

import os
import sys
import unittest

import torch

from test_ckptd import Daemon, run_ranks
from test_torch_api import stored_chunks

SKIP = 77


def cuda_rank(socket, store, rank, world, job, alloc_conf):
    """One rank; exits 0 only if every check passed (a failure exits at
    once: gRPC's threads could hold a failing interpreter at exit)."""
    try:
        cuda_rank_body(socket, store, rank, world, job, alloc_conf)
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it
        import traceback
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def cuda_rank_body(socket, store, rank, world, job, alloc_conf):
    # Before CUDA starts in this (spawned) interpreter.
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    import torch.distributed as dist
    import ckptd.torch as ckpt
    # Each rank on its own GPU where there are several (the submit thread's
    # replica check must then stay off GPU 0).
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(0)  # the same parameters on both ranks: replicas
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.LayerNorm(1024),
                                    torch.nn.Linear(1024, 256)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            g = torch.Generator("cuda").manual_seed(1)
            x = torch.randn(64, 512, device="cuda", generator=g)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

        step()
        mine = torch.full((4096,), float(rank), device="cuda")
        square = torch.randn(256, 128, device="cuda",
                             generator=torch.Generator("cuda").manual_seed(2))

        def state():
            return {"model": model.state_dict(),
                    "optim": {f"{i}.{k}": v for i, s in enumerate(opt.state.values())
                              for k, v in s.items()},
                    f"rank{rank}": {"mine": mine, "t": square.t()}, "step": 1}

        def snapshot():
            sd = state()
            return ({k: v.detach().clone() for k, v in sd["model"].items()},
                    {k: v.detach().clone() for k, v in sd["optim"].items()},
                    square.clone())

        expected_model, expected_optim, expected_square = snapshot()
        c = ckpt.checkpointer(job, socket)
        r = c.async_save(state(), checkpoint_id="step-1")
        r.wait_staged_on_stream()
        step()  # queued at once: runs after the daemon's copies
        r.upload_completion.result()
        first_plan = c._plan
        assert first_plan.gpu, "the plan has no GPU items"
        r = c.async_save(state(), checkpoint_id="step-2")
        r.wait_staged_on_stream()
        r.upload_completion.result()
        assert c._plan is first_plan, "the second save planned afresh"

        loaded = state()
        for t in (list(loaded["model"].values()) + list(loaded["optim"].values())
                  + [mine, square]):
            t.zero_()
        assert c.load(loaded, checkpoint_id="step-1") == "step-1"
        for k, v in loaded["model"].items():
            assert torch.equal(v, expected_model[k]), k
        for k, v in loaded["optim"].items():
            assert torch.equal(v, expected_optim[k]), k
        assert torch.equal(mine, torch.full_like(mine, float(rank)))
        assert torch.equal(square, expected_square), "the non-contiguous tensor"
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


class TorchCuda(unittest.TestCase):
    def run_case(self, alloc_conf):
        daemon = Daemon(flags=["--gpu=cuda"])
        self.addCleanup(daemon.stop)
        store = os.path.join(daemon.dir, "gloo")
        job = "cuda-" + (alloc_conf.replace(":", "-") or "malloc")
        self.assertEqual(run_ranks(cuda_rank, 2, daemon.socket, store, job, alloc_conf),
                         [0, 0])
        chunks = stored_chunks(daemon.socket, job, "step-1")
        # Replicated parameters are stored once; each rank's own state once.
        self.assertEqual(len(chunks["model.0.weight"]), 1)
        self.assertEqual(len(chunks["rank0.mine"]), 1)
        self.assertEqual(len(chunks["rank1.mine"]), 1)

    def test_two_processes_with_cudamalloc_segments(self):
        self.run_case("")

    def test_two_processes_with_expandable_segments(self):
        self.run_case("expandable_segments:True")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        sys.exit(SKIP)
    unittest.main()
