"""A real training run as the test: the model of examples/train_fsdp.py
trained on 4 gloo ranks (HSDP 2x2, FSDP over 4, DDP over 4) with AdamW,
checkpointed every step through ckptd.torch and, on the same state, through
stock torch.distributed.checkpoint (DCP); then resumed by 2 fresh ranks on
another mesh and compared with the run that was never interrupted.

Run by ctest as: python -m unittest test_training_run (in this directory),
with PYTHONPATH holding the built package, CKPTD_BINARY the daemon and
CKPTCTL_BINARY the CLI.

The flow, for each layout:
  1. 4 ranks train SAVED_STEPS steps; after each optimizer.step() they call
     ckptd.torch.async_save and dcp.async_save on the same state dict and
     wait for ckptd's STAGED only before the next optimizer.step(). Then
     the same processes, as the uninterrupted run, train on to LAST_STEP.
  2. 2 fresh ranks on another mesh build the model with other initial
     weights, load the latest checkpoint into get_state_dict's state dict
     in place (ckptd.torch.load; again from DCP with dcp.load), hand it over
     with set_state_dict and train to LAST_STEP, saving every step.

What is compared bit for bit, and what within a tolerance:
  - the restored state (parameters, AdamW's exp_avg, exp_avg_sq and step,
    the data RNG, the Python values) equals the uninterrupted run's at
    SAVED_STEPS bit for bit: restoring does not depend on the world size;
  - the runs resumed from ckptd and from DCP equal each other bit for bit,
    every loss and the whole final state: same state, same mesh, same
    arithmetic;
  - against the uninterrupted run, losses and final state agree within
    RESUME_RTOL of each tensor's scale, not bit for bit: with 2 ranks
    instead of 4 each rank's micro-batch is twice as long (other GEMM
    shapes) and the gradients are reduced over 2 ranks instead of 4 (gloo
    adds the partial sums in another order, FSDP divides by other factors),
    which changes the gradients' last bits from the first resumed step on.

And from what the daemon reports (ckptctl inspect, list and status, the
files under its root): every checkpoint stores each unique byte once, HSDP
replicas and plain tensors every rank holds included, and ckptd and DCP
store the same boxes of every tensor.
"""

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import ckptd.torch as ckpt
from test_ckptd import Daemon, run_ranks
from test_torch_api import _init

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))
import train_fsdp  # noqa: E402 - the example's model, data and state dict

SAVED_STEPS = 3  # the 4-rank run checkpoints steps 1..3, the fresh run resumes at 4
LAST_STEP = 6
# How far the resumed run may drift from the uninterrupted one (see the
# module comment), relative to each tensor's largest magnitude: the world
# size's roundings came to at most 5e-7 over the resumed steps (float32,
# exp_avg_sq included); one optimizer step moves the weights by about 1e-2
# of their scale, so a state restored from another step, or with a shard
# missing or misplaced, is far outside it.
RESUME_RTOL = 1e-5

# layout: (how the 4 ranks that save shard the model, how the 2 that resume do)
LAYOUTS = {"hsdp": ("hsdp", "fsdp"), "fsdp": ("fsdp", "hsdp"), "ddp": ("ddp", "ddp")}


def checkpoint_name(step):
    return f"step-{step:08d}"


# ---- in the ranks (spawned interpreters) -----------------------------------

def build(kind, world, seed):
    """The example's model, sharded as `kind` says, and AdamW. "hsdp" is 2
    replicas x world/2 shards (so 2 x 1 over 2 ranks); "ddp" is plain
    tensors, the same on every rank."""
    torch.manual_seed(seed)
    model = train_fsdp.TinyTransformer()
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        model = train_fsdp.shard(model, train_fsdp.device_mesh(
            world, 2 if kind == "hsdp" else 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


class CkptdSaver:
    """ckptd.torch's async_save, waited for as issue 11 asks: STAGED before
    the next optimizer.step(), COMMITTED only at the end."""

    def __init__(self, job, socket):
        self.job, self.socket, self.response = job, socket, None

    def before_step(self):
        if self.response is not None:
            self.response.staging_completion.result()

    def save(self, state, step):
        self.response = ckpt.async_save(state, checkpoint_id=checkpoint_name(step),
                                        job=self.job, socket=self.socket)

    def finish(self):
        self.response.upload_completion.result()


class DcpSaver:
    """Stock dcp.async_save into a directory per step, as DCP users write
    it: its default stager copies the state before async_save returns, so
    nothing is waited for before optimizer.step(); a save waits for the
    previous one's upload. Its collectives run on a group of their own,
    beside the training loop's."""

    def __init__(self, directory, group):
        self.directory, self.group, self.future = directory, group, None

    def before_step(self):
        pass

    def save(self, state, step):
        import torch.distributed.checkpoint as dcp
        if self.future is not None:
            self.future.result()
        self.future = dcp.async_save(
            state, checkpoint_id=os.path.join(self.directory, checkpoint_name(step)),
            process_group=self.group)

    def finish(self):
        self.future.result()


def run_steps(model, optimizer, rng, steps, savers, rank, world):
    """Trains `steps` (the example's data and loss), each saver saving the
    state after every optimizer step; returns the global losses."""
    losses = []
    for step in steps:
        inputs, targets = train_fsdp.next_batch(rng, rank, world)
        losses.append(train_fsdp.forward_backward(model, inputs, targets))
        for saver in savers:
            saver.before_step()
        optimizer.step()
        optimizer.zero_grad()
        if savers:
            state = train_fsdp.training_state(model, optimizer, rng, step)
            for saver in savers:
                saver.save(state, step)
    for saver in savers:
        saver.finish()
    return torch.stack(losses) if losses else torch.zeros(0)


def gathered(state):
    """{fqn: whole tensor or value} of a training state, named as DCP
    flattens it; DTensors gathered (a collective: every rank calls it)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor
    flat, _ = flatten_state_dict(state)
    out = {}
    for fqn in sorted(flat):
        v = flat[fqn]
        if isinstance(v, DTensor):
            v = v.full_tensor()
        out[fqn] = v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return out


def local_facts(state):
    """Per rank, gathered to all: the local numel of the one-element
    parameter (0: an empty shard), and the tensor bytes this rank holds."""
    import torch.distributed as dist
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor
    scale = state["model"]["logit_scale"]
    local = scale.to_local() if isinstance(scale, DTensor) else scale
    held = 0
    for v in flatten_state_dict(state)[0].values():
        if isinstance(v, torch.Tensor):
            t = v.to_local() if isinstance(v, DTensor) else v
            held += t.numel() * t.element_size()
    facts = [None] * dist.get_world_size()
    dist.all_gather_object(facts, (local.numel(), held))
    return facts


def save_run_rank(socket, store, rank, world, out):
    """Step 1 of the flow on 4 ranks, for every layout; rank 0 writes what
    the test compares to out/<layout>-uninterrupted.pt."""
    dist = _init(store, rank, world)
    torch.set_num_threads(1)  # 4 ranks share the machine's cores
    try:
        dcp_group = dist.new_group(backend="gloo")
        for layout, (kind, _) in LAYOUTS.items():
            model, optimizer = build(kind, world, seed=0)
            rng = torch.Generator().manual_seed(0)
            savers = [CkptdSaver(layout, socket),
                      DcpSaver(os.path.join(out, "dcp", layout), dcp_group)]
            losses = run_steps(model, optimizer, rng, range(1, SAVED_STEPS + 1), savers,
                               rank, world)
            state = train_fsdp.training_state(model, optimizer, rng, SAVED_STEPS)
            at_saved = gathered(state)
            facts = local_facts(state)
            losses = torch.cat([losses, run_steps(model, optimizer, rng,
                                                  range(SAVED_STEPS + 1, LAST_STEP + 1),
                                                  [], rank, world)])
            final = gathered(train_fsdp.training_state(model, optimizer, rng, LAST_STEP))
            if rank == 0:
                torch.save({"losses": losses, "at_saved": at_saved, "final": final,
                            "facts": facts},
                           os.path.join(out, f"{layout}-uninterrupted.pt"))
    finally:
        dist.destroy_process_group()


def resume_rank(socket, store, rank, world, out):
    """Step 2 of the flow on 2 ranks, for every layout, once from ckptd and
    once from DCP; rank 0 writes out/<layout>-resumed-<source>.pt."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    dist = _init(store, rank, world)
    torch.set_num_threads(1)
    try:
        dcp_group = dist.new_group(backend="gloo")
        for layout, (_, kind) in LAYOUTS.items():
            for source in ("ckptd", "dcp"):
                # Other initial weights and data RNG than the saved run's:
                # only a complete restore reproduces that run.
                model, optimizer = build(kind, world, seed=1)
                rng = torch.Generator().manual_seed(1)
                state = train_fsdp.training_state(model, optimizer, rng, 0)
                if source == "ckptd":
                    name = ckpt.load(state, checkpoint_id="latest", job=layout, socket=socket)
                    savers = [CkptdSaver(layout, socket)]
                else:
                    name = checkpoint_name(SAVED_STEPS)
                    dcp.load(state, checkpoint_id=os.path.join(out, "dcp", layout, name))
                    savers = [DcpSaver(os.path.join(out, "dcp", f"{layout}-resumed"),
                                       dcp_group)]
                set_state_dict(model, optimizer, model_state_dict=state["model"],
                               optim_state_dict=state["optim"])
                rng.set_state(state["data_rng"])
                resumed = train_fsdp.training_state(model, optimizer, rng, state["step"])
                loaded = gathered(resumed)
                facts = local_facts(resumed)
                losses = run_steps(model, optimizer, rng,
                                   range(state["step"] + 1, LAST_STEP + 1), savers,
                                   rank, world)
                final = gathered(train_fsdp.training_state(model, optimizer, rng, LAST_STEP))
                if rank == 0:
                    torch.save({"name": name, "loaded": loaded, "losses": losses,
                                "final": final, "facts": facts},
                               os.path.join(out, f"{layout}-resumed-{source}.pt"))
    finally:
        dist.destroy_process_group()


# ---- in the test process ---------------------------------------------------

def bits(t):
    """A tensor's bytes: equal bits, not equal values (-0.0 != 0.0 here)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class TrainingRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.addClassCleanup(cls.daemon.stop)
        cls.out = tempfile.mkdtemp(prefix="ckptd-training-run-")
        cls.addClassCleanup(shutil.rmtree, cls.out)
        before = cls.bytes_written()
        codes = run_ranks(save_run_rank, 4, cls.daemon.socket,
                          os.path.join(cls.out, "rendezvous-save"), cls.out)
        assert codes == [0] * 4, f"the 4-rank run failed: exit codes {codes}"
        cls.saved_run_bytes = cls.bytes_written() - before
        codes = run_ranks(resume_rank, 2, cls.daemon.socket,
                          os.path.join(cls.out, "rendezvous-resume"), cls.out)
        assert codes == [0] * 2, f"the resumed 2-rank run failed: exit codes {codes}"

        def read(name):
            return torch.load(os.path.join(cls.out, name), weights_only=False)
        cls.runs = {layout: {"uninterrupted": read(f"{layout}-uninterrupted.pt"),
                             "ckptd": read(f"{layout}-resumed-ckptd.pt"),
                             "dcp": read(f"{layout}-resumed-dcp.pt")}
                    for layout in LAYOUTS}

    @classmethod
    def ctl(cls, *args):
        out = subprocess.run([os.environ["CKPTCTL_BINARY"], "--socket", cls.daemon.socket,
                              *args], capture_output=True, text=True, check=True,
                             timeout=120).stdout
        return json.loads(out)

    @classmethod
    def bytes_written(cls):
        """The daemon's own count of the tensor bytes it wrote to files."""
        return int(cls.ctl("status", "--json")["tensor_bytes_written"])

    def assert_bit_equal(self, got, want, what):
        self.assertEqual(sorted(got), sorted(want), what)
        for fqn, w in want.items():
            g = got[fqn]
            if isinstance(w, torch.Tensor):
                self.assertIsInstance(g, torch.Tensor, f"{what}: {fqn}")
                self.assertEqual((g.dtype, g.shape), (w.dtype, w.shape), f"{what}: {fqn}")
                self.assertTrue(torch.equal(bits(g), bits(w)), f"{what}: {fqn} differs")
            else:
                self.assertEqual(g, w, f"{what}: {fqn}")

    def assert_close(self, got, want, what):
        """Within RESUME_RTOL of the largest magnitude in each tensor (a
        tolerance per tensor's scale: exp_avg_sq is ~1e-7 where weights
        are ~1)."""
        self.assertEqual(sorted(got), sorted(want), what)
        for fqn, w in want.items():
            g = got[fqn]
            if not isinstance(w, torch.Tensor):
                self.assertEqual(g, w, f"{what}: {fqn}")
                continue
            self.assertEqual((g.dtype, g.shape), (w.dtype, w.shape), f"{what}: {fqn}")
            if not w.is_floating_point():
                self.assertTrue(torch.equal(g, w), f"{what}: {fqn} differs")
                continue
            scale = w.abs().max().item()
            error = (g - w).abs().max().item()
            self.assertLessEqual(error, RESUME_RTOL * scale,
                                 f"{what}: {fqn} off by {error:.3g} at scale {scale:.3g}")

    def check_resume(self, layout):
        runs = self.runs[layout]
        reference, from_ckptd, from_dcp = runs["uninterrupted"], runs["ckptd"], runs["dcp"]
        self.assertEqual(from_ckptd["name"], checkpoint_name(SAVED_STEPS))
        # Restored exactly what the uninterrupted run held at the saved
        # step, into a mesh of another world size; so did DCP.
        self.assert_bit_equal(from_ckptd["loaded"], reference["at_saved"],
                              "loaded from ckptd vs the uninterrupted run")
        self.assert_bit_equal(from_dcp["loaded"], reference["at_saved"],
                              "loaded from DCP vs the uninterrupted run")
        # The two resumed runs are the same computation on the same state.
        self.assertEqual(len(from_ckptd["losses"]), LAST_STEP - SAVED_STEPS)
        self.assertTrue(torch.equal(bits(from_ckptd["losses"]), bits(from_dcp["losses"])),
                        f"losses: ckptd {from_ckptd['losses']} DCP {from_dcp['losses']}")
        self.assert_bit_equal(from_ckptd["final"], from_dcp["final"],
                              "resumed from ckptd vs resumed from DCP")
        # And the uninterrupted run's, up to the world size's rounding.
        self.assert_close({"losses": from_ckptd["losses"]},
                          {"losses": reference["losses"][SAVED_STEPS:]}, "losses")
        self.assert_close(from_ckptd["final"], reference["final"],
                          "resumed from ckptd vs the uninterrupted run")
        # The resumed run's own last checkpoint, saved by 2 ranks, holds
        # its final state (loaded here by one process, as plain tensors).
        final = from_ckptd["final"]
        fresh = {fqn: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
                 for fqn, v in final.items()}
        self.assertEqual(ckpt.load(fresh, checkpoint_id="latest", job=layout,
                                   socket=self.daemon.socket), checkpoint_name(LAST_STEP))
        self.assert_bit_equal(fresh, final, "the resumed run's last checkpoint")

    def test_hsdp_2x2_resumed_as_fsdp_on_2_ranks_continues_the_uninterrupted_run(self):
        self.check_resume("hsdp")
        # The one-element parameter left empty shards on both sides:
        # shard index 1 of the 2x2 mesh, and rank 1 of FSDP over 2.
        self.assertEqual([f[0] for f in self.runs["hsdp"]["uninterrupted"]["facts"]],
                         [1, 0, 1, 0])
        self.assertEqual([f[0] for f in self.runs["hsdp"]["ckptd"]["facts"]], [1, 0])

    def test_fsdp_over_4_resumed_as_hsdp_2x1_continues_the_uninterrupted_run(self):
        self.check_resume("fsdp")
        self.assertEqual([f[0] for f in self.runs["fsdp"]["uninterrupted"]["facts"]],
                         [1, 0, 0, 0])

    def test_ddp_replicated_state_resumed_on_2_ranks_continues_the_uninterrupted_run(self):
        self.check_resume("ddp")

    def stored_chunks(self, layout, step):
        """(index, files on disk) of a committed checkpoint."""
        index = self.ctl("inspect", "--json", layout, checkpoint_name(step))["index"]
        directory = os.path.join(self.daemon.dir, "root", layout, checkpoint_name(step))
        return index, directory

    def test_every_run_writes_each_unique_byte_once_hsdp_replicas_included(self):
        all_written = 0
        for layout in LAYOUTS:
            listed = {c["checkpoint"]: c
                      for c in self.ctl("list", "--json", layout)["checkpoints"]}
            reference = self.runs[layout]["uninterrupted"]["at_saved"]
            tensor_fqns = {k for k, v in reference.items() if isinstance(v, torch.Tensor)}
            value_fqns = set(reference) - tensor_fqns
            # The unique state: every tensor's global bytes, once.
            unique = sum(reference[k].numel() * reference[k].element_size() for k in tensor_fqns)
            for step in range(1, SAVED_STEPS + 1):
                with self.subTest(layout=layout, step=step):
                    index, directory = self.stored_chunks(layout, step)
                    chunks = index["tensors"]
                    boxes = [(c["fqn"], tuple(c.get("offsets", []))) for c in chunks]
                    self.assertEqual(len(boxes), len(set(boxes)), "a chunk stored twice")
                    stored = {c["fqn"] for c in chunks}
                    self.assertEqual(stored, tensor_fqns | value_fqns)
                    tensor_bytes = sum(int(c["length"]) for c in chunks
                                       if c["fqn"] in tensor_fqns)
                    self.assertEqual(tensor_bytes, unique)
                    for fqn in value_fqns:  # one pickled copy of each value
                        self.assertEqual(sum(c["fqn"] == fqn for c in chunks), 1, fqn)
                    data = sum(int(c["length"]) for c in chunks)
                    # Files hold the chunks and their headers, nothing else.
                    on_disk = sorted(f for f in os.listdir(directory)
                                     if f.endswith(".safetensors"))
                    self.assertEqual(on_disk, sorted(f["name"] for f in index["files"]))
                    for f in index["files"]:
                        self.assertEqual(os.path.getsize(os.path.join(directory, f["name"])),
                                         int(f["size"]), f["name"])
                    self.assertEqual(sum(int(f["size"]) - int(f["data_start"])
                                         for f in index["files"]), data)
                    self.assertEqual(int(listed[checkpoint_name(step)]["total_bytes"]),
                                     sum(int(f["size"]) for f in index["files"]))
                    all_written += data
            if layout == "hsdp":
                held = sum(f[1] for f in self.runs[layout]["uninterrupted"]["facts"])
                print(f"\nHSDP 2x2: {unique} unique tensor bytes a checkpoint, stored "
                      f"{tensor_bytes} ({data} with the pickled values); the 4 ranks "
                      f"hold {held}", file=sys.stderr)
                # The ranks do hold replicas (each shard twice, the plain
                # tensors four times): storing `unique` bytes is the dedup.
                self.assertGreaterEqual(held, 2 * unique)
        # The daemon wrote those bytes and no others (no copy written and
        # then dropped): its counter over the 4-rank run.
        self.assertEqual(self.saved_run_bytes, all_written)

    def test_ckptd_and_dcp_store_the_same_chunks_of_the_same_state(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        for layout in LAYOUTS:
            with self.subTest(layout=layout):
                index, _ = self.stored_chunks(layout, SAVED_STEPS)
                ours = {}
                for c in index["tensors"]:
                    ours.setdefault(c["fqn"], []).append(
                        ([int(o) for o in c.get("offsets", [])],
                         [int(n) for n in c.get("local_shape", [])]))
                metadata = dcp.FileSystemReader(os.path.join(
                    self.out, "dcp", layout, checkpoint_name(SAVED_STEPS))).read_metadata()
                theirs = {}
                for fqn, m in metadata.state_dict_metadata.items():
                    if isinstance(m, TensorStorageMetadata):
                        theirs[fqn] = sorted((list(c.offsets), list(c.sizes)) for c in m.chunks
                                             if all(n > 0 for n in c.sizes))
                # Every tensor in the same boxes (empty shards stored by
                # neither); DCP's byte values are ckptd's pickled values.
                self.assertEqual({k: sorted(v) for k, v in ours.items() if k in theirs},
                                 theirs)
                values = {fqn for fqn, m in metadata.state_dict_metadata.items()
                          if not isinstance(m, TensorStorageMetadata)}
                self.assertEqual(set(ours) - set(theirs), values)


if __name__ == "__main__":
    unittest.main()
