"""torchtitan's checkpoint manager over ckptd (ckptd.torchtitan), against a
real daemon.

Run by ctest as: python -m unittest test_torchtitan (in this directory),
with PYTHONPATH holding the built package, CKPTD_BINARY the daemon and
CKPTCTL_BINARY the CLI. Skipped, saying so, where torchtitan is not
importable (pip install --no-deps -r scripts/requirements-torchtitan.txt).

ManagerTest ports the cases of torchtitan's own manager tests
(tests/unit_tests/test_checkpoint.py, TestCheckpointManager) that apply to a
manager that stores through a daemon, with torchtitan's real
OptimizersContainer and LRSchedulersContainer instead of its fakes, and the
daemon instead of mocked dcp.save/load: what was saved is read back through
the daemon, not counted in a mock. Cases not ported, and why:
test_nonzero_rank_does_not_purge_or_save and the purge tests (retention is
the daemon's: test_keep_latest_k_is_the_daemons_retention), the
remote-storage and purge-thread tests (DCP's file system seam), the
DCP-internal async tests (their mocked DefaultStager: here the futures are
ckptd's own, test_async_save_futures), test_non_persist_buffer_not_saved and
test_verify_prefix (ModelWrapper's and the flattening's, torchtitan's code
both managers share; the flattening is checked in test_save_load_restores_state).

TrainingRunTest: torchtitan's llama3 debug model (6.2 M parameters), its
ModelWrapper, OptimizersContainer (AdamW as its debug config) and
LRSchedulersContainer (warmup 2, linear decay), FSDP2 over 2 gloo ranks on
CPU, a train_state Stateful as the trainer's: a run checkpointed every 2
steps through CkptdCheckpointManager (async) is SIGKILLed (rank 1, after
step 5), resumed from the latest committed checkpoint by 2 fresh processes
and trained to the last step; it matches the run that was never interrupted
bit for bit (every parameter shard, the optimizer state, the LR scheduler,
the step, every loss after the resume). torchtitan's Trainer itself does not
run here: it needs the datasets/torchdata/tokenizer stack (and the c4_test
dataset and tokenizer of torchtitan's repository, not its wheel) and takes
the device "cuda" where no accelerator is found; and FlexAttention, the
debug model's attention, has no backward on CPU, so its inner attention is
torchtitan's own ScaledDotProductAttention (causal, no parameters: the
checkpointed state is unchanged).
"""

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import ckptd.torch as ckpt
from ckptd import checkpoint_ids
from test_ckptd import Daemon

try:
    import torchtitan  # noqa: F401
    from torchtitan.components.checkpointer import BaseCheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from ckptd.torchtitan import CkptdCheckpointManager
    TORCHTITAN = None
except ImportError as e:  # pragma: no cover - depends on the environment
    TORCHTITAN = (f"torchtitan is not importable ({e}); "
                  f"pip install --no-deps -r scripts/requirements-torchtitan.txt")


class Loader:
    """A dataloader's Stateful state (torchtitan's are Stateful)."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, sd):
        self.position = sd["position"]


def _train_one_step(model, optimizers, lr_schedulers, seed):
    g = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(4, 2, generator=g)).square().sum()
    loss.backward()
    optimizers.step()
    lr_schedulers.step()
    optimizers.zero_grad()


def _snapshot(model, optimizers, lr_schedulers, loader, trainer):
    def clone(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if isinstance(v, dict):
            return {k: clone(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clone(x) for x in v]
        return v
    return {"model": clone(model.state_dict()), "optim": clone(optimizers.state_dict()),
            "lr": clone(lr_schedulers.state_dict()), "loader": loader.position,
            "trainer": trainer.clone()}


@unittest.skipIf(TORCHTITAN, TORCHTITAN)
class ManagerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="titan-")
        self.folder = self._testMethodName  # relative to base: one job per test
        self.parts = self.build_parts(seed=0)

    def build_parts(self, seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(2, 2)
        optimizers = default_adamw(lr=0.1).build(model_parts=[model])
        lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
            optimizers=optimizers, training_steps=10)
        _train_one_step(model, optimizers, lr_schedulers, seed)  # Adam's state exists
        return {"model": model, "optimizers": optimizers, "lr_schedulers": lr_schedulers,
                "loader": Loader(), "trainer": torch.tensor([1.2347])}

    def manager(self, parts=None, **config):
        p = parts or self.parts
        cfg = dict(enable=True, folder=self.folder, interval=1, keep_latest_k=0,
                   last_save_model_only=False, export_dtype="float32",
                   exclude_from_loading=[], initial_load_path=None,
                   initial_load_model_only=False, socket=self.daemon.socket)
        cfg.update(config)
        m = CkptdCheckpointManager.Config(**cfg).build(
            dataloader=p["loader"], model_parts=[p["model"]], optimizers=p["optimizers"],
            lr_schedulers=p["lr_schedulers"], states={"trainer": p["trainer"]},
            sd_adapter=None, base_folder=self.base)
        self.addCleanup(m.close)
        return m

    def listed(self, manager):
        return ckpt.list_checkpoints(job=manager.job, socket=self.daemon.socket)

    def mutate(self, p, seed):
        _train_one_step(p["model"], p["optimizers"], p["lr_schedulers"], seed)
        p["loader"].position += 7
        p["trainer"].add_(1)

    def assertSnapshot(self, p, snap):
        now = _snapshot(p["model"], p["optimizers"], p["lr_schedulers"], p["loader"],
                        p["trainer"])
        for k, v in snap["model"].items():
            self.assertTrue(torch.equal(now["model"][k], v), k)
        self.assertEqual(now["optim"].keys(), snap["optim"].keys())
        for k, v in snap["optim"].items():
            if isinstance(v, torch.Tensor):
                self.assertTrue(torch.equal(now["optim"][k], v), k)
            else:
                self.assertEqual(now["optim"][k], v, k)
        self.assertEqual(now["lr"], snap["lr"])
        self.assertEqual(now["loader"], snap["loader"])
        self.assertTrue(torch.equal(now["trainer"], snap["trainer"]))

    def snap(self, p=None):
        p = p or self.parts
        return _snapshot(p["model"], p["optimizers"], p["lr_schedulers"], p["loader"],
                         p["trainer"])

    # -- configuration ------------------------------------------------------

    def test_config_builds_this_manager_where_the_trainer_takes_a_manager_config(self):
        cfg = CkptdCheckpointManager.Config(enable=True, socket=self.daemon.socket,
                                            keep_latest_k=0)
        self.assertIsInstance(cfg, BaseCheckpointManager.Config)
        m = self.manager()
        self.assertIsInstance(m, CkptdCheckpointManager)
        folder = os.path.join(self.base, self.folder)
        # The job is the one ckptd.torch gives a DCP path under the folder.
        self.assertEqual(m.job, checkpoint_ids.resolve(f"{folder}/step-1", None)[0])
        self.assertEqual(checkpoint_ids.checkpoint_path(m.job, "step-1"),
                         f"{folder}/step-1")
        with self.assertRaisesRegex(ValueError, "ckptctl export"):
            CkptdCheckpointManager.Config(last_save_in_hf=True)
        with self.assertRaisesRegex(ValueError, "Invalid async_mode"):
            CkptdCheckpointManager.Config(async_mode="sometimes")
        with self.assertRaisesRegex(ValueError, "job"):
            CkptdCheckpointManager.Config(job="a/b")
        # A disabled manager does nothing (upstream's *_when_checkpoint_disabled).
        off = CkptdCheckpointManager.Config(enable=False).build(
            dataloader=None, model_parts=[self.parts["model"]], optimizers=None,
            lr_schedulers=None, states={}, sd_adapter=None, base_folder=self.base)
        off.maybe_wait_for_staging()
        off.maybe_wait_for_saving()
        self.assertFalse(off.save(curr_step=1))
        self.assertFalse(off.load())

    def test_explicit_job_and_the_path_a_dcp_user_would_pass(self):
        m = self.manager(job="titan-explicit")
        self.assertTrue(m.save(curr_step=1))
        self.assertEqual(ckpt.list_checkpoints(job="titan-explicit",
                                               socket=self.daemon.socket), ["step-1"])
        # With the default job, ckptd.torch loads the manager's checkpoint by
        # the path DCP's manager would have written it to.
        self.folder = "by-path"
        m2 = self.manager()
        m2.save(curr_step=3)
        w = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
        ckpt.load(w, checkpoint_id=os.path.join(self.base, "by-path", "step-3"),
                  socket=self.daemon.socket)
        self.assertTrue(torch.equal(w["weight"], self.parts["model"].weight))

    # -- upstream's TestCheckpointManager -----------------------------------

    def test_save_load_restores_state(self):
        m = self.manager()
        saved = self.snap()
        self.assertTrue(m.save(curr_step=1))
        self.assertEqual(self.listed(m), ["step-1"])
        self.mutate(self.parts, seed=5)
        with torch.no_grad():
            self.parts["model"].weight.zero_()
        self.assertTrue(m.load(step=1))
        self.assertSnapshot(self.parts, saved)

    def test_load_latest_and_a_named_step(self):
        m = self.manager(interval=2)
        snaps = {}
        for step in range(1, 7):
            self.mutate(self.parts, seed=step)
            if m.save(curr_step=step):
                snaps[step] = self.snap()
        self.assertEqual(sorted(snaps), [2, 4, 6])
        self.assertEqual(self.listed(m), ["step-2", "step-4", "step-6"])
        fresh = self.build_parts(seed=99)
        m2 = self.manager(fresh)
        self.assertTrue(m2.load(step=-1))
        self.assertSnapshot(fresh, snaps[6])
        self.assertTrue(m2.load(step=4))
        self.assertSnapshot(fresh, snaps[4])
        with self.assertRaisesRegex(FileNotFoundError, "--checkpoint.load_step=5"):
            m2.load(step=5)
        self.assertSnapshot(fresh, snaps[4])

    def test_load_returns_false_when_no_checkpoint_folder(self):
        m = self.manager(folder="nonexistent")
        before = self.snap()
        with self.assertLogs("ckptd.torchtitan", "INFO") as logs:
            self.assertFalse(m.load(step=-1))
        self.assertIn("No checkpoint was provided, this is a fresh start.",
                      "\n".join(logs.output))
        self.assertSnapshot(self.parts, before)

    def test_explicit_load_step_raises_when_checkpoint_folder_missing(self):
        m = self.manager(folder="nonexistent2")
        with self.assertRaisesRegex(FileNotFoundError, "--checkpoint.load_step=5"):
            m.load(step=5)

    def test_interval_respects_interval(self):
        m = self.manager(interval=3)
        expect = []
        for step, last, saves in [(1, False, False), (2, False, False), (2, True, True),
                                  (3, False, True), (4, False, False), (4, True, True)]:
            self.assertEqual(m.save(curr_step=step, last_step=last), saves, (step, last))
            if saves:
                expect.append(f"step-{step}")
            self.assertEqual(self.listed(m), expect, (step, last))

    def test_enable_first_step_checkpoint(self):
        m = self.manager(interval=10)
        m.save(curr_step=1)
        self.assertEqual(self.listed(m), [])
        m.save(curr_step=10)
        self.assertEqual(self.listed(m), ["step-10"])
        self.folder = "first-step-on"
        m2 = self.manager(interval=10, enable_first_step_checkpoint=True)
        m2.save(curr_step=1)
        self.assertEqual(self.listed(m2), ["step-1"])
        m2.save(curr_step=2)
        self.assertEqual(self.listed(m2), ["step-1"])
        m2.save(curr_step=10)
        self.assertEqual(self.listed(m2), ["step-1", "step-10"])

    def test_load_only_prevents_saving(self):
        m = self.manager(load_only=True)
        for step, last in [(1, False), (5, False), (10, True)]:
            self.assertFalse(m.save(curr_step=step, last_step=last))
        self.assertEqual(self.listed(m), [])
        m.close()
        m2 = self.manager(load_only=False)
        self.assertTrue(m2.save(curr_step=1))
        self.assertEqual(self.listed(m2), ["step-1"])

    def test_last_save_model_only_in_export_dtype(self):
        m = self.manager(last_save_model_only=True, export_dtype="bfloat16")
        self.assertTrue(m.save(curr_step=2, last_step=True))
        self.assertEqual(self.listed(m), ["step-2"])
        model = self.parts["model"]
        sd = {"weight": torch.zeros(2, 2, dtype=torch.bfloat16),
              "bias": torch.zeros(2, dtype=torch.bfloat16)}
        ckpt.load(sd, checkpoint_id="step-2", job=m.job, socket=self.daemon.socket)
        self.assertTrue(torch.equal(sd["weight"], model.weight.detach().bfloat16()))
        self.assertTrue(torch.equal(sd["bias"], model.bias.detach().bfloat16()))
        # Model only: no optimizer, no train state.
        with self.assertRaises(ckpt.MissingKeys):
            ckpt.load({"trainer": torch.zeros(1)}, checkpoint_id="step-2", job=m.job,
                      socket=self.daemon.socket)

    def test_model_only_load_at_step_0(self):
        # A seed checkpoint (create_seed_checkpoint: save(0, last_step=True),
        # model only) is loaded model only, whatever else is asked.
        m = self.manager(last_save_model_only=True)
        self.assertTrue(m.save(curr_step=0, last_step=True))
        weights = {k: v.clone() for k, v in self.parts["model"].state_dict().items()}
        fresh = self.build_parts(seed=7)
        before = self.snap(fresh)
        self.assertFalse(torch.equal(fresh["model"].weight, weights["weight"]))
        m2 = self.manager(fresh)
        self.assertTrue(m2.load(step=-1))
        for k, v in weights.items():
            self.assertTrue(torch.equal(fresh["model"].state_dict()[k], v), k)
        after = self.snap(fresh)
        self.assertEqual(after["lr"], before["lr"])
        self.assertEqual(after["loader"], before["loader"])
        for k, v in before["optim"].items():
            if isinstance(v, torch.Tensor):
                self.assertTrue(torch.equal(after["optim"][k], v), k)

    def test_exclude_from_loading(self):
        m = self.manager()
        saved = self.snap()
        m.save(curr_step=1)
        self.mutate(self.parts, seed=3)
        mutated = self.snap()
        m2 = self.manager(exclude_from_loading=["dataloader", "lr_scheduler", "trainer"])
        self.assertTrue(m2.load(step=1))
        now = self.snap()
        for k, v in saved["model"].items():
            self.assertTrue(torch.equal(now["model"][k], v), k)
        for k, v in saved["optim"].items():
            if isinstance(v, torch.Tensor):
                self.assertTrue(torch.equal(now["optim"][k], v), k)
        self.assertEqual(now["lr"], mutated["lr"])
        self.assertNotEqual(now["lr"], saved["lr"])
        self.assertEqual(now["loader"], mutated["loader"])
        self.assertTrue(torch.equal(now["trainer"], mutated["trainer"]))
        m3 = self.manager(exclude_from_loading=["nothing-by-this-name"])
        with self.assertRaisesRegex(ValueError, "nothing-by-this-name not found"):
            m3.load(step=1)

    def test_initial_load_path_from_a_stock_dcp_directory(self):
        import torch.distributed.checkpoint as dcp
        initial = os.path.join(self.base, "initial", "step-100")
        weights = {k: v.clone() for k, v in self.parts["model"].state_dict().items()}
        dcp.save(dict(weights), checkpoint_id=initial)  # a model-only DCP checkpoint
        fresh = self.build_parts(seed=11)
        m = self.manager(fresh, initial_load_path=initial, initial_load_model_only=True)
        self.assertTrue(m.load(step=-1))
        for k, v in weights.items():
            self.assertTrue(torch.equal(fresh["model"].state_dict()[k], v), k)
        # Once the job has a checkpoint, initial_load_path is ignored (the
        # fault-tolerance branch).
        self.mutate(fresh, seed=12)
        resumed = self.snap(fresh)
        m.save(curr_step=5)
        self.mutate(fresh, seed=13)
        m2 = self.manager(fresh, initial_load_path=initial, initial_load_model_only=True)
        self.assertTrue(m2.load(step=-1))
        self.assertSnapshot(fresh, resumed)
        bad = self.manager(self.build_parts(seed=1), folder="other",
                           initial_load_path=os.path.join(self.base, "absent"))
        with self.assertRaisesRegex(ValueError, "initial_load_path is invalid"):
            bad.load()

    def test_async_save_futures(self):
        m = self.manager(async_mode="async", interval=10)
        self.assertIsNone(m.staging_future)
        saved = self.snap()
        self.assertTrue(m.save(curr_step=10))
        staging, upload = m.staging_future, m.save_future
        self.assertIsNotNone(staging)
        self.assertIsNotNone(upload)
        m.maybe_wait_for_staging()
        self.assertTrue(staging.done())
        self.assertIsNone(m.staging_future)
        # Staged: the trainer may mutate while the save commits.
        self.mutate(self.parts, seed=21)
        with torch.no_grad():
            self.parts["model"].weight.add_(1000)
        after_mutation = self.snap()
        # The next save waits for the previous one's commit first.
        self.assertTrue(m.save(curr_step=20))
        self.assertTrue(upload.done())
        self.assertIsNone(upload.exception())
        self.assertIsNot(m.save_future, upload)
        m.maybe_wait_for_saving()
        self.assertIsNone(m.save_future)
        self.assertEqual(self.listed(m), ["step-10", "step-20"])
        self.mutate(self.parts, seed=22)
        self.assertTrue(m.load(step=10))
        self.assertSnapshot(self.parts, saved)
        self.assertTrue(m.load(step=20))
        self.assertSnapshot(self.parts, after_mutation)

    def test_keep_latest_k_is_the_daemons_retention(self):
        # Not applied by the client (ckptd.torch cannot delete): said once,
        # and every checkpoint is kept by a daemon without keep_last.
        with self.assertLogs("ckptd.torchtitan", "WARNING") as logs:
            m = self.manager(keep_latest_k=2)
        self.assertIn("keep_last", "\n".join(logs.output))
        for step in (1, 2, 3):
            m.save(curr_step=step)
        self.assertEqual(self.listed(m), ["step-1", "step-2", "step-3"])
        # A daemon with keep_last 2 keeps the newest 2 of the job.
        daemon = Daemon(flags=("--keep_last", "2"))
        self.addCleanup(daemon.stop)
        m2 = self.manager(keep_latest_k=2, socket=daemon.socket, folder="retained")
        for step in (1, 2, 3):
            m2.save(curr_step=step)
        deadline = time.monotonic() + 5
        while True:
            listed = ckpt.list_checkpoints(job=m2.job, socket=daemon.socket)
            if listed == ["step-2", "step-3"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(listed, ["step-2", "step-3"])
        fresh = self.build_parts(seed=3)
        m3 = self.manager(fresh, socket=daemon.socket, folder="retained")
        self.assertTrue(m3.load(step=-1))
        with self.assertRaisesRegex(FileNotFoundError, "--checkpoint.load_step=1"):
            m3.load(step=1)


# -- the training run -------------------------------------------------------

STEPS = 6
INTERVAL = 2
KILL_AFTER = 5  # rank 1 is SIGKILLed after this step (step 4's save in flight or done)


def _build(rank, world):
    """torchtitan's debug model under FSDP2, its optimizers, LR schedulers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry
    spec = model_registry("debugmodel", attn_backend="flex")
    torch.manual_seed(1234)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    model.init_weights(buffer_device=None)
    for layer in model.layers.values():  # FlexAttention has no backward on CPU
        layer.attention.inner_attention = ScaledDotProductAttention(
            ScaledDotProductAttention.Config())
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # As llama3_debugmodel's config.
    optimizers = default_adamw(lr=8e-4).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(
        warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0).build(
        optimizers=optimizers, training_steps=STEPS)
    return model, optimizers, lr_schedulers


class TrainState:
    """The trainer's own Stateful ("train_state"): step and tokens seen."""

    def __init__(self):
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd):
        self.step = sd["step"]
        self.ntokens_seen = sd["ntokens_seen"]


def _local(v):
    from torch.distributed.tensor import DTensor
    if isinstance(v, DTensor):
        return v.to_local().clone()
    if isinstance(v, torch.Tensor):
        return v.clone()
    return v


def _train(rank, world, manager, model, optimizers, lr_schedulers, train_state,
           kill_after=None):
    losses = {}
    while train_state.step < STEPS:
        train_state.step += 1
        step = train_state.step
        g = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, 2048, (2, 17), generator=g)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 tokens[:, 1:].flatten())
        loss.backward()
        train_state.ntokens_seen += tokens.numel()
        if manager is not None:
            manager.maybe_wait_for_staging()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        losses[step] = loss.detach().clone()
        _say(f"step {step}")
        if manager is not None:
            manager.save(step, last_step=(step == STEPS))
        if kill_after == step and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    return losses


def _state(model, optimizers, lr_schedulers, train_state, losses, resumed_from):
    return {"model": {k: _local(v) for k, v in model.state_dict().items()},
            "optim": {k: _local(v) for k, v in optimizers.state_dict().items()},
            "lr": lr_schedulers.state_dict(), "train": train_state.state_dict(),
            "losses": losses, "resumed_from": resumed_from}


def _say(what):
    print(f"{time.monotonic() - _T0:.2f}s {what}", flush=True)


_T0 = time.monotonic()


def train_rank(phase, rank, world, store, socket, base, out):
    """One rank of the run (started by TrainingRunTest in a fresh python).
    phase "killed": train with checkpoints, rank 1 SIGKILLed after
    KILL_AFTER; phase "resume": resume from the latest committed checkpoint,
    train to STEPS, then, in the same process, the uninterrupted run from
    scratch without a manager; both final states written to `out`."""
    torch.set_num_threads(1)
    import torch.distributed as dist
    _say(f"rank {rank} {phase}: imported")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    model, optimizers, lr_schedulers = _build(rank, world)
    _say("built")
    train_state = TrainState()
    manager = CkptdCheckpointManager.Config(
        enable=True, folder="checkpoint", interval=INTERVAL, async_mode="async",
        keep_latest_k=0, socket=socket).build(
        dataloader=None, model_parts=[model], optimizers=optimizers,
        lr_schedulers=lr_schedulers, states={"train_state": train_state},
        sd_adapter=None, base_folder=base)
    manager.load(step=-1)
    resumed_from = train_state.step
    _say(f"loaded: step {resumed_from}")
    if phase == "killed":
        _train(rank, world, manager, model, optimizers, lr_schedulers, train_state,
               kill_after=KILL_AFTER)
        raise AssertionError("not killed")
    losses = _train(rank, world, manager, model, optimizers, lr_schedulers, train_state)
    manager.close()
    _say("resumed run done")
    results = {"resumed": _state(model, optimizers, lr_schedulers, train_state, losses,
                                 resumed_from)}
    model, optimizers, lr_schedulers = _build(rank, world)
    train_state = TrainState()
    losses = _train(rank, world, None, model, optimizers, lr_schedulers, train_state)
    results["uninterrupted"] = _state(model, optimizers, lr_schedulers, train_state,
                                      losses, 0)
    _say("uninterrupted run done")
    torch.save(results, out)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def _fork_rank(phase, rank, world, socket, base):
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: its own log, then the rank
        fd = os.open(os.path.join(base, f"{phase}-{rank}.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        train_rank(phase, rank, world, os.path.join(base, f"store-{phase}"), socket,
                   base, os.path.join(base, f"{phase}-{rank}.pt"))
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _exit_status(pid):
    return -os.WTERMSIG(s) if os.WIFSIGNALED(s := os.waitpid(pid, 0)[1]) else \
        os.WEXITSTATUS(s)


def launch_ranks(base, socket, world=2):
    """Imports torch and torchtitan once and forks the ranks of both phases
    (each a fresh process to gloo and gRPC, which this one never starts):
    "killed", then, once the test has looked at what committed (resume.go),
    "resume". Writes each phase's exit statuses to <phase>.status."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    from torchtitan.models.llama3 import model_registry  # noqa: F401
    import threading
    # No Python thread, and no thread beyond the one `import torch` starts
    # (as DataLoader's forked workers, the children need none of them).
    tasks = os.listdir("/proc/self/task")
    assert threading.active_count() == 1 and len(tasks) <= 2, tasks
    pids = [_fork_rank("killed", r, world, socket, base) for r in range(world)]
    statuses = [0] * world
    statuses[1] = _exit_status(pids[1])
    os.kill(pids[0], signal.SIGKILL)
    statuses[0] = _exit_status(pids[0])
    _write_status(base, "killed", statuses)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(base, "resume.go")):
        assert time.monotonic() < deadline, "the test did not say go"
        time.sleep(0.05)
    pids = [_fork_rank("resume", r, world, socket, base) for r in range(world)]
    _write_status(base, "resume", [_exit_status(p) for p in pids])


def _write_status(base, phase, statuses):
    tmp = os.path.join(base, f"{phase}.status.tmp")
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, statuses)))
    os.rename(tmp, os.path.join(base, f"{phase}.status"))


@unittest.skipIf(TORCHTITAN, TORCHTITAN)
class TrainingRunTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(self.daemon.stop)
        self.dir = tempfile.mkdtemp(prefix="titan-run-")

    def launch(self):
        """The rank launcher (launch_ranks), in a fresh python."""
        code = (f"import test_torchtitan as t; t.launch_ranks({self.dir!r}, "
                f"{self.daemon.socket!r})")
        with open(os.path.join(self.dir, "launcher.log"), "w") as log:
            return subprocess.Popen(
                [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                cwd=os.path.dirname(os.path.abspath(__file__)),
                start_new_session=True)  # its group: the forked ranks too

    def wait_for(self, launcher, name, timeout=120):
        path = os.path.join(self.dir, name)
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if launcher.poll() is not None or time.monotonic() > deadline:
                self.fail(f"no {name}; launcher {launcher.poll()}: "
                          f"{self.log('launcher.log')}")
            time.sleep(0.05)
        with open(path) as f:
            return [int(x) for x in f.read().split()]

    @staticmethod
    def kill_group(launcher):
        """The launcher and any rank it forked that is left (a failed run)."""
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        launcher.wait()

    def log(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()[-3000:]

    def tearDown(self):
        if os.environ.get("TITAN_KEEP_LOGS"):
            for n in sorted(os.listdir(self.dir)):
                if n.endswith(".log"):
                    print(n, self.log(n), sep="\n")

    def test_killed_run_resumes_bit_for_bit(self):
        launcher = self.launch()
        self.addCleanup(self.kill_group, launcher)
        # Rank 1 SIGKILLed after step 5; rank 0, blocked in the next step's
        # collective, killed by the launcher: the job is lost.
        statuses = self.wait_for(launcher, "killed.status")
        self.assertEqual(statuses[1], -signal.SIGKILL, self.log("killed-1.log"))
        job = checkpoint_ids.resolve(os.path.join(self.dir, "checkpoint", "step-0"),
                                     None)[0]
        committed = ckpt.list_checkpoints(job=job, socket=self.daemon.socket)
        self.assertIn("step-2", committed)  # its commit was awaited by step 4's save
        self.assertTrue(set(committed) <= {"step-2", "step-4"}, committed)

        open(os.path.join(self.dir, "resume.go"), "w").close()
        statuses = self.wait_for(launcher, "resume.status")
        for rank, status in enumerate(statuses):
            self.assertEqual(status, 0, self.log(f"resume-{rank}.log"))
        self.assertEqual(launcher.wait(timeout=30), 0, self.log("launcher.log"))
        latest = int(committed[-1].split("-")[1])
        self.assertIn(f"step-{STEPS}", ckpt.list_checkpoints(job=job,
                                                             socket=self.daemon.socket))
        for rank in range(2):
            r = torch.load(os.path.join(self.dir, f"resume-{rank}.pt"), weights_only=False)
            resumed, reference = r["resumed"], r["uninterrupted"]
            self.assertEqual(resumed["resumed_from"], latest)
            self.assertEqual(sorted(resumed["losses"]), list(range(latest + 1, STEPS + 1)))
            for step, loss in resumed["losses"].items():
                self.assertTrue(torch.equal(loss, reference["losses"][step]), step)
            self.assertEqual(resumed["train"], reference["train"])
            self.assertEqual(resumed["train"]["step"], STEPS)
            self.assertEqual(resumed["lr"], reference["lr"])
            for part in ("model", "optim"):
                self.assertEqual(resumed[part].keys(), reference[part].keys())
                for k, v in reference[part].items():
                    if isinstance(v, torch.Tensor):
                        self.assertTrue(torch.equal(resumed[part][k], v), (rank, k))
                    else:
                        self.assertEqual(resumed[part][k], v, (rank, k))
            self.assertTrue(any(k.endswith("exp_avg_sq") for k in reference["optim"]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    unittest.main()
