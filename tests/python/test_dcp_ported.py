"""PyTorch's own DCP tests as the judge (issue 31, item 2): the save/load
cases of PyTorch's test/distributed/checkpoint suite that apply to an async
saver, ported once against a `backend` object offering DCP's save,
async_save and load, and run twice:

  - backend "dcp":   stock torch.distributed.checkpoint, FileSystemWriter /
                     FileSystemReader on a temporary directory;
  - backend "ckptd": ckptd.torch against a real daemon.

Both take the same checkpoint_id: a path under the case's temporary
directory (ckptd maps its directory to a job, docs/DCP.md). Each case names
the upstream test it comes from and keeps that test's assertions; where a
port had to change something (FSDP2 for FSDP1 on CPU, 2 ranks for 4, a
seed), the case says what and why. Cases that cannot apply to ckptd, and
why, are rows of docs/DCP.md.

Multi-rank cases run on 2 gloo ranks on CPU in a pool of 2 spawned
interpreters started once for the module (a spawn costs seconds of
import on 2 cores); a case that fails on one rank while the other waits in
a collective is timed out, and the pool is started afresh for the next.

Run by ctest as: python -m unittest test_dcp_ported (in this directory),
with PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import io
import multiprocessing
import os
import queue
import shutil
import tempfile
import traceback
import unittest

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import ckptd.torch as ckpt
from test_ckptd import Daemon, exit_before_finalizing

WORLD = 2
CASE_TIMEOUT_S = 120  # a hang; the slowest case takes a few seconds


# ---- the backends -----------------------------------------------------------

class DcpBackend:
    """Stock DCP on the file system: what the upstream tests run."""
    name = "dcp"

    def save(self, state_dict, *, checkpoint_id, overwrite=True):
        if overwrite:
            return dcp.save(state_dict, checkpoint_id=checkpoint_id)
        return dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(
            checkpoint_id, overwrite=False))

    def async_save(self, state_dict, *, checkpoint_id):
        return dcp.async_save(state_dict, checkpoint_id=checkpoint_id)

    def load(self, state_dict, *, checkpoint_id, allow_partial_load=False):
        from torch.distributed.checkpoint import DefaultLoadPlanner
        dcp.load(state_dict, checkpoint_id=checkpoint_id,
                 planner=DefaultLoadPlanner(allow_partial_load=allow_partial_load))

    @staticmethod
    def wait(response):
        """The upload future of what async_save returned (DCP returns a
        Future or an AsyncSaveResponse, by version and options)."""
        return getattr(response, "upload_completion", response).result()


class CkptdBackend:
    """ckptd.torch through the daemon at `socket`."""
    name = "ckptd"

    def __init__(self, socket):
        self.socket = socket

    def save(self, state_dict, *, checkpoint_id, overwrite=True):
        # ckptd has no storage writer: overwrite is save's own flag.
        ckpt.save(state_dict, checkpoint_id=checkpoint_id, socket=self.socket,
                  overwrite=overwrite)

    def async_save(self, state_dict, *, checkpoint_id):
        return ckpt.async_save(state_dict, checkpoint_id=checkpoint_id,
                               socket=self.socket)

    def load(self, state_dict, *, checkpoint_id, allow_partial_load=False):
        ckpt.load(state_dict, checkpoint_id=checkpoint_id, socket=self.socket,
                  allow_partial_load=allow_partial_load)

    @staticmethod
    def wait(response):
        return response.upload_completion.result()


def make_backend(name, socket):
    return DcpBackend() if name == "dcp" else CkptdBackend(socket)


# ---- assertions the upstream tests use --------------------------------------

class Checks(unittest.TestCase):
    """unittest's assertions plus what PyTorch's TestCase.assertEqual does
    for tensors (values close within dtype's default tolerances, DTensors
    compared by their full value) and what common_state_dict's
    VerifyStateDictMixin checks (torch.testing._internal.common_utils needs
    expecttest, which the venv does not have)."""

    def __init__(self):
        super().__init__("run")

    def run(self, result=None):  # pragma: no cover - never run as a test
        pass

    def assertEqual(self, first, second, msg=None):  # noqa: N802
        if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
            torch.testing.assert_close(full(first), full(second), msg=msg,
                                       check_device=False)
        elif isinstance(first, dict) and isinstance(second, dict):
            super().assertEqual(set(first), set(second), msg)
            for k in first:
                self.assertEqual(first[k], second[k], f"{msg or ''}[{k!r}]")
        elif (isinstance(first, (list, tuple)) and isinstance(second, (list, tuple))
              and len(first) == len(second)):
            for i, (a, b) in enumerate(zip(first, second)):
                self.assertEqual(a, b, f"{msg or ''}[{i}]")
        else:
            super().assertEqual(first, second, msg)

    def verify_msd(self, want, got):
        """VerifyStateDictMixin._verify_msd: the same keys, each value equal
        as a full tensor."""
        self.assertEqual(sorted(want), sorted(got))
        for k, v in want.items():
            self.assertEqual(v, got[k], k)

    def verify_osd(self, model, optim, osd):
        """VerifyStateDictMixin._verify_osd: `osd` (by fqn, from
        get_optimizer_state_dict) equals optim.state_dict() (by id)."""
        params = list(model.parameters())
        fqns = [n for n, _ in model.named_parameters()]
        param_id = {p: i for i, p in enumerate(params)}
        state = optim.state_dict()["state"]
        for p, s in optim.state.items():
            fqn = fqns[param_id[p]]
            self.assertIn(fqn, osd["state"])
            for name, v in state[param_id[p]].items():
                self.assertEqual(v, osd["state"][fqn][name], f"{fqn}.{name}")
        for group, fqn_group in zip(optim.state_dict()["param_groups"],
                                    osd["param_groups"]):
            for k, v in group.items():
                if k != "params":
                    self.assertEqual(v, fqn_group[k], k)


def full(t):
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        return t.full_tensor()
    return t


# ---- models and state the upstream tests use --------------------------------

class TestDummyModel(torch.nn.Module):
    """test_e2e_save_and_load.py's TestDummyModel (4 Linears, seeded)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net1 = torch.nn.Linear(8, 16)
        self.net2 = torch.nn.Linear(16, 32)
        self.net3 = torch.nn.Linear(32, 64)
        self.net4 = torch.nn.Linear(64, 8)

    def forward(self, x):
        for layer in (self.net1, self.net2, self.net3, self.net4):
            x = torch.nn.functional.relu(layer(x))
        return x

    def get_input(self):
        return torch.rand(8, 8)


class TestStatefulObj:
    """test_e2e_save_and_load.py's TestStatefulObj."""

    def __init__(self):
        self.data = torch.rand(10, 10)

    def state_dict(self):
        return {"data": self.data}

    def load_state_dict(self, state_dict):
        self.data = state_dict["data"]

    def __eq__(self, other):
        return torch.equal(self.data, other.data)


class TestTrainState:
    """test_e2e_save_and_load.py's TestTrainState: tensors and a BytesIO."""

    def __init__(self):
        self.step, self.current_loss, self.losses = 0, -1.0, []

    def state_dict(self):
        losses = io.BytesIO()
        torch.save(self.losses, losses)
        return {"step": torch.tensor(self.step, dtype=torch.int32),
                "current_loss": torch.tensor(self.current_loss, dtype=torch.float32),
                "losses": losses}

    def load_state_dict(self, state_dict):
        self.step = state_dict["step"].item()
        self.current_loss = state_dict["current_loss"].item()
        state_dict["losses"].seek(0)
        self.losses = torch.load(state_dict["losses"])

    def __eq__(self, other):
        return (self.step, self.current_loss, self.losses) == (
            other.step, other.current_loss, other.losses)


def train(model, optim, steps=1):
    """test_e2e_save_and_load.py's _train: seeded inputs, a train state."""
    torch.manual_seed(0)
    loss, state = None, TestTrainState()
    for _ in range(steps):
        loss = model(model.get_input()).sum()
        loss.backward()
        state.step += 1
        state.current_loss = torch.rand(1).item()
        state.losses.append(state.current_loss)
        optim.step()
        optim.zero_grad()
    return loss, state


def create_model(kind):
    """test_e2e_save_and_load.py's _create_model. FSDP and HSDP are FSDP2
    (fully_shard) here: FSDP1 needs an accelerator ("FSDP needs a non-CPU
    accelerator device"), the ranks here are CPU."""
    from torch.distributed.checkpoint.state_dict import (
        _patch_model_state_dict, _patch_optimizer_state_dict)
    model = TestDummyModel()
    if kind in ("fsdp", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        # HSDP: upstream's (2, world // 2) mesh, replicate x shard.
        mesh = (init_device_mesh("cpu", (WORLD,)) if kind == "fsdp" else init_device_mesh(
            "cpu", (2, WORLD // 2), mesh_dim_names=("replicate", "shard")))
        for layer in (model.net1, model.net2, model.net3, model.net4):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind == "ddp":
        inner = model
        model = torch.nn.parallel.DistributedDataParallel(inner)
        model.get_input = inner.get_input
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    if kind != "none":
        _patch_model_state_dict(model)
        _patch_optimizer_state_dict(model, optimizers=optim)
    return model, optim


# ---- single-process cases (run in the test process) -------------------------

def case_planner_strict(t, backend, folder):
    """test_planner.py TestLoadPlanner.test_strict: a load into a module with
    a parameter the checkpoint lacks fails with DCP's CheckpointException
    naming the missing key, unless partial loads are allowed."""
    path = os.path.join(folder, "ckpt")
    original = torch.nn.Linear(2, 2)
    backend.save({"module": original}, checkpoint_id=path)

    new = torch.nn.Linear(2, 2)
    new.extra_param = torch.nn.Parameter(torch.randn(2, 2))
    backend.load({"module": new}, checkpoint_id=path, allow_partial_load=True)
    # (upstream stops at "no error"; the loaded values are checked too)
    t.assertTrue(torch.equal(new.weight, original.weight))
    t.assertTrue(torch.equal(new.bias, original.bias))

    with t.assertRaisesRegex(CheckpointException, "Missing key in checkpoint"):
        backend.load({"module": new}, checkpoint_id=path, allow_partial_load=False)


def case_planner_different_sizes(t, backend, folder):
    """test_planner.py TestLoadPlanner.test_load_different_sizes_throws."""
    path = os.path.join(folder, "ckpt")
    backend.save({"module": torch.nn.Linear(2, 2)}, checkpoint_id=path)
    with t.assertRaisesRegex(CheckpointException, "Size mismatch"):
        backend.load({"module": torch.nn.Linear(3, 2)}, checkpoint_id=path)


def case_stateful_and_non_stateful_loads(t, backend, folder):
    """test_e2e_save_and_load.py test_stateful_and_non_stateful_loads: a
    Stateful is loaded in place (its dict entry never set); a plain value's
    entry is replaced."""
    from torch.distributed.checkpoint.stateful import Stateful

    class StateDict(dict):
        def __init__(self):
            self.set_sd_item_called = False

        def __setitem__(self, item, value):
            self.set_sd_item_called = True
            super().__setitem__(item, value)

    class Foo(Stateful):
        def __init__(self):
            self.load_state_dict_called = False

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            self.load_state_dict_called = True

    foo = Foo()
    sd = StateDict()
    sd["foo"] = foo
    sd.set_sd_item_called = False
    backend.save(sd, checkpoint_id=os.path.join(folder, "stateful"))
    backend.load(sd, checkpoint_id=os.path.join(folder, "stateful"))
    t.assertTrue(foo.load_state_dict_called)
    t.assertFalse(sd.set_sd_item_called)

    sd = StateDict()
    sd["foo"] = {"replicated": torch.rand(10, 10), "bytes": [1, 2, 3, 4]}
    sd.set_sd_item_called = False
    # Upstream saves both to one directory (overwriting); a second id here,
    # overwrite has its own case.
    backend.save(sd, checkpoint_id=os.path.join(folder, "plain"))
    backend.load(sd, checkpoint_id=os.path.join(folder, "plain"))
    t.assertTrue(sd.set_sd_item_called)


def case_no_dist(t, backend, folder):
    """test_e2e_save_and_load.py test_no_dist: an empty state dict saved and
    loaded without torch.distributed initialized."""
    backend.save({}, checkpoint_id=os.path.join(folder, "ckpt"))
    backend.load({}, checkpoint_id=os.path.join(folder, "ckpt"))


def case_init_state_dict(t, backend, folder):
    """test_e2e_save_and_load.py TestInitStateDict.test_init_state_dict: the
    load is in place (the same dicts), and set_state_dict then restores the
    optimizer's non-tensor state (lr 0.1, not 0.2)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_state_dict)
    path = os.path.join(folder, "ckpt")
    model = TestDummyModel()
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    backend.save({"model": get_model_state_dict(model),
                  "optimizer": get_optimizer_state_dict(model, optim)},
                 checkpoint_id=path)

    torch.manual_seed(0)
    model_2 = TestDummyModel()
    optim_2 = torch.optim.Adam(model_2.parameters(), lr=0.2)
    msd = get_model_state_dict(model_2)
    osd = get_optimizer_state_dict(model_2, optim_2)
    to_load = {"model": msd, "optimizer": osd}
    backend.load(to_load, checkpoint_id=path)
    t.assertTrue(msd is to_load["model"])
    t.assertTrue(osd is to_load["optimizer"])

    set_state_dict(model_2, optim_2, model_state_dict=to_load["model"],
                   optim_state_dict=to_load["optimizer"])
    t.assertEqual(msd, get_model_state_dict(model_2))
    t.assertEqual(osd, get_optimizer_state_dict(model_2, optim_2))
    t.assertEqual(optim_2.param_groups[0]["lr"], 0.1)


# ---- multi-rank cases (run in the pool's ranks) -----------------------------

def case_e2e(t, backend, folder, kind, async_op):
    """test_e2e_save_and_load.py TestE2ESaveAndLoad._run_e2e_test (test_e2e,
    test_e2e_async_cached): a model, its optimizer and two Stateful objects
    saved by Stateful; loaded into a fresh parallel model, the objects
    equal, one more step equals the unparallelized model's, and the state
    dicts agree. compile=False only (compiling costs tens of seconds on 2
    cores and is no part of the save). Upstream's FSDP_TP is disabled there
    (its TODO); on 2 ranks its 2-D mesh would have a TP degree of 1."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    path = os.path.join(folder, "ckpt")
    model, optim = create_model("none")
    train(model, optim, steps=2)

    dist_model, dist_optim = create_model(kind)
    _, original_train_state = train(dist_model, dist_optim, steps=2)
    original_stateful_obj = TestStatefulObj()
    sd = {"model": dist_model, "optimizer": dist_optim,
          "s": original_stateful_obj, "train_state": original_train_state}
    if async_op:
        backend.wait(backend.async_save(sd, checkpoint_id=path))
    else:
        backend.save(sd, checkpoint_id=path)

    loaded_stateful_obj = TestStatefulObj()
    loaded_train_state = TestTrainState()
    dist_model, dist_optim = create_model(kind)
    backend.load({"model": dist_model, "optimizer": dist_optim,
                  "s": loaded_stateful_obj, "train_state": loaded_train_state},
                 checkpoint_id=path)
    t.assertEqual(original_stateful_obj, loaded_stateful_obj)
    t.assertEqual(original_train_state, loaded_train_state)

    loss, _ = train(model, optim, steps=1)
    dist_loss, _ = train(dist_model, dist_optim, steps=1)
    t.assertEqual(loss, dist_loss)

    dist_msd, dist_osd = get_state_dict(dist_model, optimizers=dist_optim)
    model_sd, _ = get_state_dict(model, optimizers=optim)
    t.verify_msd(model_sd, dist_msd)
    # _verify_osd_by_load: a fresh optimizer of the plain model given the
    # parallel model's optimizer state equals the trained one.
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict)
    full_osd = get_optimizer_state_dict(
        dist_model, dist_optim, options=StateDictOptions(full_state_dict=True))
    new_optim = torch.optim.Adam(model.parameters(), lr=0.1)
    set_optimizer_state_dict(model, new_optim, optim_state_dict=full_osd)
    t.assertEqual(optim.state_dict(), new_optim.state_dict())


def case_partial_load(t, backend, folder):
    """test_e2e_save_and_load.py test_partial_load: a checkpoint of model and
    optimizer loaded into {"model": ...} alone restores the model.
    (_load_state_dict_from_keys, its second half, reads DCP's storage
    without a template: not in ckptd's API, docs/DCP.md.)"""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    path = os.path.join(folder, "ckpt")
    model, optim = create_model("none")
    train(model, optim, steps=2)
    dist_model, dist_optim = create_model("fsdp")
    train(dist_model, dist_optim, steps=2)
    backend.save({"model": dist_model, "optimizer": dist_optim}, checkpoint_id=path)

    dist_model, _ = create_model("fsdp")
    backend.load({"model": dist_model}, checkpoint_id=path)
    t.verify_msd(get_model_state_dict(model), get_model_state_dict(dist_model))


def case_different_ordered_keys(t, backend, folder):
    """test_e2e_save_and_load.py test_different_ordered_state_dict_keys:
    ranks whose dicts list the keys in other orders, and whose Statefuls run
    collectives in load_state_dict, do not deadlock."""
    import torch.distributed as dist
    world, path = dist.get_world_size(), os.path.join(folder, "ckpt")

    class Foo:
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            tl = [torch.ones(2, dtype=torch.int64) for _ in range(world)]
            t_ = torch.arange(2, dtype=torch.int64) + 1 + 2 * dist.get_rank()
            dist.all_gather(tl, t_)

    class Bar:
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * dist.get_rank()
            dist.all_reduce(tensor)

    sd = {"A": Foo(), "B": Bar()} if dist.get_rank() == 0 else {"B": Bar(), "A": Foo()}
    backend.save(sd, checkpoint_id=path)
    backend.load(sd, checkpoint_id=path)


def case_overwrite(t, backend, folder):
    """test_e2e_save_and_load.py TestCheckpointOrderingAndOverwrite
    .test_overwrite: a second save to one checkpoint_id overwrites; with
    overwrite=False it fails, "Checkpoint already exists". Seeded: the
    tensor is replicated, and ckptd refuses replicas that differ (DCP keeps
    rank 0's silently; docs/DCP.md)."""
    path = os.path.join(folder, "ckpt")
    torch.manual_seed(0)
    t1, t2 = torch.randn(10), torch.randn(10)
    backend.save({"random": t1}, checkpoint_id=path)
    backend.save({"random": t2}, checkpoint_id=path, overwrite=True)
    sd = {"random": torch.zeros(10)}
    backend.load(sd, checkpoint_id=path)
    t.assertTrue(torch.allclose(sd["random"], t2))
    with t.assertRaisesRegex(CheckpointException, ".*Checkpoint already exists.*"):
        backend.save({"random": t2}, checkpoint_id=path, overwrite=False)


class MyTestModule(torch.nn.Module):
    """test_dtensor_checkpoint.py's MyTestModule: a sharded and a replicated
    DTensor parameter and extra state (a Python int and a tensor)."""

    def __init__(self, sdt, rdt, extra_state=1, extra_state_tensor=None):
        super().__init__()
        self.rdt = torch.nn.Parameter(rdt)
        self.sdt = torch.nn.Parameter(sdt)
        self._extra_state = extra_state
        self._extra_state_tensor = (torch.zeros(1) if extra_state_tensor is None
                                    else extra_state_tensor)

    def get_extra_state(self):
        return {"extra_state": self._extra_state,
                "extra_state_tensor": self._extra_state_tensor}

    def set_extra_state(self, state):
        self._extra_state = state["extra_state"]
        self._extra_state_tensor = state["extra_state_tensor"]


def case_dtensor_planner(t, backend, folder):
    """test_dtensor_checkpoint.py test_distributed_tensor_planner: a module
    of a Shard(0) and a Replicate() DTensor and extra state, saved, then
    loaded into one built from other values."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    path = os.path.join(folder, "ckpt")

    def create(to_shard, to_replicate):
        mesh = DeviceMesh("cpu", list(range(dist.get_world_size())))
        sdt = distribute_tensor(to_shard, mesh, placements=[Shard(0)])
        rdt = distribute_tensor(to_replicate, mesh, placements=[Replicate()])
        return MyTestModule(sdt, rdt), sdt, rdt

    local_tensor = torch.arange(0, 4, dtype=torch.float32)
    local_tensor_2 = torch.arange(4, 8, dtype=torch.float32)
    model, sharded_dt, replicated_dt = create(local_tensor, local_tensor_2)
    backend.save(model.state_dict(), checkpoint_id=path)

    model, _, _ = create(local_tensor * 10, local_tensor_2 * 10)
    state_dict = model.state_dict()
    backend.load(state_dict, checkpoint_id=path)
    for k, v in state_dict.items():
        if k == "rdt":
            t.assertEqual(replicated_dt.to_local(), v.to_local())
        if k == "sdt":
            t.assertEqual(sharded_dt.to_local(), v.to_local())
        if k == "_extra_state":
            t.assertEqual(1, v["extra_state"])
            t.assertEqual(torch.tensor([0.0]), v["extra_state_tensor"])


def _placements(spec):
    from torch.distributed.tensor import Replicate, Shard
    return [Shard(0) if p == "S" else Replicate() for p in spec]


ONE_D = ["S", "R"]
TWO_D = ["RR", "RS", "SR", "SS"]


def _mesh(ndim):
    from torch.distributed.device_mesh import init_device_mesh
    # Upstream's 2-D mesh is (2, world // 2): (2, 1) on 2 ranks.
    return init_device_mesh("cpu", (WORLD,) if ndim == 1 else (2, WORLD // 2))


def _reshard_once(t, backend, path, save_spec, load_spec):
    """One save with placements `save_spec` and load with `load_spec`, then
    upstream's checks: the loaded tensor, replicated, is the global tensor;
    redistributed back (same mesh only), it equals the saved local shard."""
    from torch.distributed.tensor import distribute_tensor, zeros
    global_tensor = torch.arange(16, dtype=torch.float).view(4, 4)
    mesh = _mesh(len(save_spec))
    saved = {"dtensor": distribute_tensor(global_tensor, mesh, _placements(save_spec))}
    backend.save(saved, checkpoint_id=path)

    load_mesh = _mesh(len(load_spec))
    to_load = {"dtensor": zeros([4, 4], device_mesh=load_mesh,
                                placements=_placements(load_spec))}
    backend.load(to_load, checkpoint_id=path)
    to_load["dtensor"] = to_load["dtensor"].redistribute(
        load_mesh, placements=_placements("R" * len(load_spec)))
    t.assertEqual(global_tensor, to_load["dtensor"].to_local())
    if len(save_spec) == len(load_spec):
        to_load["dtensor"] = to_load["dtensor"].redistribute(
            load_mesh, placements=_placements(save_spec))
        t.assertEqual(saved["dtensor"].to_local(), to_load["dtensor"].to_local())


def case_dtensor_resharding(t, backend, folder):
    """test_dtensor_resharding.py, every case of its two classes:
    TestDTensorReshardPlacementChange test_1d_to_1d_reshard_placement_change
    (2 pairs) and test_2d_to_2d_reshard_placement_change (12 pairs), and
    TestDTensorReshardMeshChange test_1d_to_2d_reshard_mesh_change and
    test_2d_to_1d_reshard_mesh_change (every 1-D x 2-D placement). Upstream
    saves each to one directory, overwriting; here each save has its own
    checkpoint_id (overwrite has its own case)."""
    pairs = [(a, b) for a in ONE_D for b in ONE_D if a != b]
    pairs += [(a, b) for a in TWO_D for b in TWO_D if a != b]
    pairs += [(a, b) for a in ONE_D for b in TWO_D]
    pairs += [(a, b) for a in TWO_D for b in ONE_D]
    for i, (a, b) in enumerate(pairs):
        with t.subTest(save=a, load=b):
            _reshard_once(t, backend, os.path.join(folder, f"{i}-{a}-{b}"), a, b)


def case_state_dict_fsdp2(t, backend, folder):
    """test_state_dict.py TestStateDict._test_save_load with FSDP2
    (test_fully_shard, wrapping each layer and the root) and Adam/AdamW
    optimizers: the distributed model and optimizer's get_state_dict,
    saved and loaded into a fresh distributed model through set_state_dict,
    equal the plain model's trained alongside (_verify_msd, _verify_osd),
    and training on from both stays equal."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    for i, optim_class in enumerate((torch.optim.Adam, torch.optim.AdamW)):
        with t.subTest(optimizer=optim_class.__name__):
            path = os.path.join(folder, f"ckpt-{i}")
            model = TestDummyModel()
            optim = optim_class(model.parameters(), lr=1e-3)
            dist_model, _ = create_model("fsdp")
            dist_optim = optim_class(dist_model.parameters(), lr=1e-3)
            train(model, optim, steps=2)
            train(dist_model, dist_optim, steps=2)
            msd, osd = get_state_dict(dist_model, dist_optim)
            t.verify_msd(model.state_dict(), msd)
            t.verify_osd(dist_model, dist_optim, osd)
            backend.save({"model": msd, "optim": osd}, checkpoint_id=path)

            new_model, _ = create_model("fsdp")
            new_optim = optim_class(new_model.parameters(), lr=1e-3)
            new_msd, new_osd = get_state_dict(new_model, new_optim)
            to_load = {"model": new_msd, "optim": new_osd}
            backend.load(to_load, checkpoint_id=path)
            set_state_dict(new_model, new_optim, model_state_dict=to_load["model"],
                           optim_state_dict=to_load["optim"])
            got_msd, got_osd = get_state_dict(new_model, new_optim)
            t.verify_msd(msd, got_msd)
            t.verify_osd(new_model, new_optim, osd)
            t.verify_msd(model.state_dict(), got_msd)

            loss, _ = train(model, optim, steps=1)
            dist_loss, _ = train(new_model, new_optim, steps=1)
            t.assertEqual(loss, dist_loss)


def case_fsdp_optim_state(t, backend, folder):
    """test_fsdp_optim_state.py test_load_sharded_optimizer_state_dict: the
    model loaded first and alone, the optimizer (whose state Adam creates
    lazily: empty before the load) loaded after it; its state equals what
    was saved, tensor for tensor. FSDP2 and DTensors for upstream's FSDP1
    and ShardedTensors (FSDP1 needs an accelerator); the optimizer's
    template comes from get_optimizer_state_dict, which creates the lazy
    state, where upstream's load_sharded_optimizer_state_dict allocates it
    from DCP's metadata (docs/DCP.md)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)
    from torch.distributed.tensor import DTensor
    path = os.path.join(folder, "ckpt")
    model, optim = create_model("fsdp")
    model(model.get_input()).sum().backward()
    optim.step()
    optim_osd = get_optimizer_state_dict(model, optim)
    backend.save({"model": get_model_state_dict(model), "optim": optim_osd},
                 checkpoint_id=path)

    model_2, optim_2 = create_model("fsdp")
    t.assertEqual(0, len(optim_2.state))
    state_dict = {"model": get_model_state_dict(model_2)}
    backend.load(state_dict, checkpoint_id=path)
    set_model_state_dict(model_2, state_dict["model"])

    optim_state = {"optim": get_optimizer_state_dict(model_2, optim_2)}
    backend.load(optim_state, checkpoint_id=path)
    set_optimizer_state_dict(model_2, optim_2, optim_state_dict=optim_state["optim"])
    osd_after_load = get_optimizer_state_dict(model_2, optim_2)

    before, after = optim_osd["state"], osd_after_load["state"]
    t.assertEqual(len(before), len(after))
    for fqn, states in before.items():
        for state_name, state in states.items():
            state2 = after.get(fqn).get(state_name)
            if isinstance(state, DTensor):
                t.assertTrue(isinstance(state2, DTensor))
                torch.testing.assert_close(state, state2)
            else:
                t.assertEqual(state, state2)


# ---- the rank pool -----------------------------------------------------------

def rank_main(store, rank, world, inbox, outbox):
    """A pool rank: a gloo group for its life, then cases from `inbox`."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    checks = Checks()
    while True:
        job = inbox.get()
        if job is None:
            break
        case, backend_name, socket, folder, kwargs = job
        try:
            globals()[case](checks, make_backend(backend_name, socket), folder, **kwargs)
            dist.barrier()
            outbox.put((rank, None))
        except BaseException:  # CheckpointException is a BaseException
            outbox.put((rank, traceback.format_exc()))
    dist.destroy_process_group()
    exit_before_finalizing(0)


class RankPool:
    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.dir = tempfile.mkdtemp(prefix="dcp-ported-pool-")
        store = os.path.join(self.dir, "store")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(WORLD)]
        self.ranks = [ctx.Process(target=rank_main, args=(
            store, r, WORLD, self.inboxes[r], self.outbox))
            for r in range(WORLD)]
        for p in self.ranks:
            p.start()

    def run(self, case, backend, socket, folder, kwargs):
        """[traceback or None] by rank; raises TimeoutError where a rank
        did not answer in CASE_TIMEOUT_S (the pool is then unusable)."""
        for inbox in self.inboxes:
            inbox.put((case, backend, socket, folder, kwargs))
        errors = [None] * WORLD
        for _ in range(WORLD):
            try:
                rank, error = self.outbox.get(timeout=CASE_TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError(f"{case} on {backend}: a rank did not finish in "
                                   f"{CASE_TIMEOUT_S} s") from None
            errors[rank] = error
        return errors

    def close(self, kill=False):
        for p, inbox in zip(self.ranks, self.inboxes):
            if not kill:
                inbox.put(None)
        for p in self.ranks:
            p.join(10 if not kill else 0)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the unittest side ------------------------------------------------------

_daemon = None
_pool = None


def setUpModule():
    global _daemon
    _daemon = Daemon()


def tearDownModule():
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None
    _daemon.stop()


class Ported:
    """The cases, once per backend (a subclass sets BACKEND). One daemon and
    one pool of ranks serve both backends."""
    BACKEND = None

    def setUp(self):
        self.folder = tempfile.mkdtemp(prefix=f"dcp-ported-{self.BACKEND}-")
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)

    def backend(self):
        return make_backend(self.BACKEND, _daemon.socket)

    def in_ranks(self, case, **kwargs):
        global _pool
        if _pool is None:
            _pool = RankPool()
        try:
            errors = _pool.run(case, self.BACKEND, _daemon.socket, self.folder, kwargs)
        except TimeoutError:
            _pool.close(kill=True)
            _pool = None
            raise
        failed = [f"rank {r}:\n{e}" for r, e in enumerate(errors) if e]
        if failed:
            self.fail("\n".join(failed))

    # single process
    def test_planner_strict_and_partial_load(self):
        case_planner_strict(self, self.backend(), self.folder)

    def test_planner_load_different_sizes_throws(self):
        case_planner_different_sizes(self, self.backend(), self.folder)

    def test_e2e_stateful_and_non_stateful_loads(self):
        case_stateful_and_non_stateful_loads(self, self.backend(), self.folder)

    def test_e2e_no_dist(self):
        case_no_dist(self, self.backend(), self.folder)

    def test_e2e_init_state_dict(self):
        case_init_state_dict(Checks(), self.backend(), self.folder)

    # 2 ranks
    def test_e2e_fsdp(self):
        self.in_ranks("case_e2e", kind="fsdp", async_op=False)

    def test_e2e_fsdp_async(self):
        self.in_ranks("case_e2e", kind="fsdp", async_op=True)

    def test_e2e_hsdp(self):
        self.in_ranks("case_e2e", kind="hsdp", async_op=False)

    def test_e2e_ddp(self):
        self.in_ranks("case_e2e", kind="ddp", async_op=False)

    def test_e2e_partial_load(self):
        self.in_ranks("case_partial_load")

    def test_e2e_different_ordered_state_dict_keys(self):
        self.in_ranks("case_different_ordered_keys")

    def test_e2e_overwrite(self):
        self.in_ranks("case_overwrite")

    def test_dtensor_checkpoint_planner(self):
        self.in_ranks("case_dtensor_planner")

    def test_dtensor_resharding(self):
        self.in_ranks("case_dtensor_resharding")

    def test_state_dict_fsdp2_with_optimizers(self):
        self.in_ranks("case_state_dict_fsdp2")

    def test_fsdp_optim_state(self):
        self.in_ranks("case_fsdp_optim_state")


class StockDcpTest(Ported, unittest.TestCase):
    BACKEND = "dcp"


class CkptdTorchTest(Ported, unittest.TestCase):
    BACKEND = "ckptd"


if __name__ == "__main__":
    unittest.main()
