"""Tests of ckptd.torch, the DCP-shaped API, against a real ckptd daemon.

Run by ctest as: python -m unittest test_torch_api (in this directory), with
PYTHONPATH holding the built package, CKPTD_BINARY the daemon to start and
CKPTCTL_BINARY the CLI that inspects what was stored.
Multi-rank cases run gloo on CPU in spawned interpreters.
"""

import gc
import json
import os
import pickle
import random
import subprocess
import unittest
import weakref

import numpy as np
import torch

import ckptd
import ckptd.torch as ckpt
from ckptd.flatten import flatten
from test_ckptd import Daemon, run_ranks

ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16,
              torch.int32, torch.uint32, torch.int64, torch.uint64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.complex64,
              torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
              torch.float8_e5m2fnuz]


def random_tensor(shape, dtype, g):
    raw = torch.randint(0, 256, (int(np.prod(shape)) * dtype.itemsize,),
                        dtype=torch.uint8, generator=g)
    t = raw.view(dtype).reshape(shape)
    return (t.view(torch.uint8) & 1).bool() if dtype == torch.bool else t


# Bytes a second: a one-rank save of the cancel test's state took 0.75 s
# to commit at 32 KiB/s (after the first, which the cap's one-second burst
# covers), against 3 to 4 ms uncapped; at this cap, two ranks' take seconds.
WRITE_CAP_FOR_CANCEL = 16 << 10


class TinyModel(torch.nn.Module):
    def __init__(self, tied=False):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def train_steps(model, optimizer, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 11, (4, 5), generator=g)
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 11), ids.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def assert_same(test, got, want, where=""):
    """Nested equality: tensors bit-exact, everything else by ==."""
    if isinstance(want, torch.Tensor):
        test.assertIsInstance(got, torch.Tensor, where)
        test.assertEqual(got.dtype, want.dtype, where)
        test.assertEqual(got.shape, want.shape, where)
        # Byte for byte: NaN payloads and -0.0 included, for every dtype.
        def raw(t):
            return t.detach().reshape(-1).contiguous().view(torch.uint8)
        test.assertTrue(torch.equal(raw(got), raw(want)), where)
    elif isinstance(want, dict):
        test.assertEqual(set(got), set(want), where)
        for k in want:
            assert_same(test, got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        test.assertEqual(type(got), type(want), where)
        test.assertEqual(len(got), len(want), where)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(test, a, b, f"{where}[{i}]")
    elif isinstance(want, np.ndarray):
        test.assertTrue(np.array_equal(got, want), where)
    else:
        test.assertEqual(got, want, where)


def blank(state):
    """A copy of `state` with the same structure, tensors zeroed and every
    other leaf None: what a fresh process would load into."""
    from ckptd.flatten import set_leaf
    out = pickle.loads(pickle.dumps(state))
    leaves, paths = flatten(out)
    for fqn, leaf in leaves.items():
        set_leaf(out, paths[fqn],
                 torch.zeros_like(leaf) if isinstance(leaf, torch.Tensor) else None)
    return out


def stored_chunks(socket, job, name):
    """{fqn: [(offsets, local shape)]} of the chunks a committed checkpoint
    stores, from `ckptctl inspect --json`."""
    ckptctl = os.environ.get("CKPTCTL_BINARY") or os.path.join(
        os.path.dirname(os.environ["CKPTD_BINARY"]), "..", "client", "ckptctl")
    out = subprocess.run([ckptctl, "--socket", socket, "inspect", "--json", job, name],
                         capture_output=True, text=True, check=True).stdout
    chunks = {}
    for t in json.loads(out)["index"]["tensors"]:
        chunks.setdefault(t["fqn"], []).append(
            ([int(o) for o in t.get("offsets", [])],
             [int(n) for n in t.get("local_shape", [])]))
    return chunks


# ---- multi-rank bodies (run in spawned interpreters) -----------------------

def _init(store, rank, world):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    return dist


def _fails_naming(future, fqn: str, what: str) -> None:
    """`future` of a save whose replicas of `fqn` disagree raises
    ReplicaMismatchError naming it."""
    try:
        future.result()
    except ckpt.ReplicaMismatchError as e:
        assert f"'{fqn}'" in str(e), str(e)
    else:
        raise AssertionError(f"a save whose {what} disagree succeeded")


def replicated_state_rank(socket, store, rank, world, job):
    """Two ranks save FSDP-style state: a DTensor sharded so that rank 1's
    shard is empty, AdamW-like step scalars and Python values on both ranks
    (replicated), then a save whose replicas disagree, which must fail on
    both ranks naming the fqn; then both load the first checkpoint back."""
    dist = _init(store, rank, world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    try:
        mesh = init_device_mesh("cpu", (world,))
        full = torch.arange(1 * 6, dtype=torch.float32).reshape(1, 6)  # 1 row, 2 ranks
        big = torch.arange(10 * 4, dtype=torch.float32).reshape(10, 4)
        sd = {"model": {"tiny": distribute_tensor(full, mesh, [Shard(0)]),
                        "big": distribute_tensor(big, mesh, [Shard(0)])},
              "optim": {"state": {"model.tiny": {"step": torch.tensor(3.0)},
                                  "model.big": {"step": torch.tensor(3.0)}},
                        "param_groups": [{"lr": 0.01, "betas": (0.9, 0.95),
                                          "params": ["model.tiny", "model.big"]}]},
              "dataloader": {"epoch": 1, "seen": list(range(100))}}
        if rank == 1:
            assert sd["model"]["tiny"].to_local().numel() == 0
        ckpt.save(sd, checkpoint_id="step-1", job=job, socket=socket)

        bad = dict(sd, optim={"state": {"model.tiny": {"step": torch.tensor(3.0 + rank)},
                                        "model.big": {"step": torch.tensor(3.0)}},
                              "param_groups": sd["optim"]["param_groups"]})
        r = ckpt.async_save(bad, checkpoint_id="step-2", job=job, socket=socket)
        for future in (r.staging_completion, r.upload_completion):
            _fails_naming(future, "optim.state.model.tiny.step", "replicas")
        bad_value = dict(sd, dataloader={"epoch": 1 + rank, "seen": []})
        r = ckpt.async_save(bad_value, checkpoint_id="step-2", job=job, socket=socket)
        _fails_naming(r.upload_completion, "dataloader.epoch", "values")

        fresh = {"model": {"tiny": distribute_tensor(torch.zeros(1, 6), mesh, [Shard(0)]),
                           "big": distribute_tensor(torch.zeros(10, 4), mesh, [Shard(0)])},
                 "optim": {"state": {"model.tiny": {"step": torch.tensor(0.0)},
                                     "model.big": {"step": torch.tensor(0.0)}},
                           "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0),
                                             "params": []}]},
                 "dataloader": {"epoch": 0, "seen": []}}
        name = ckpt.load(fresh, checkpoint_id="latest", job=job, socket=socket)
        assert name == "step-1", name
        assert torch.equal(fresh["model"]["big"].full_tensor(), big)
        assert torch.equal(fresh["model"]["tiny"].full_tensor(), full)
        assert fresh["optim"]["state"]["model.tiny"]["step"].item() == 3.0
        assert fresh["optim"]["param_groups"] == sd["optim"]["param_groups"]
        assert fresh["dataloader"] == sd["dataloader"]
    finally:
        dist.destroy_process_group()


def per_rank_plain_rank(socket, store, rank, world, job):
    """Ranks that hold plain tensors under fqns of their own (so that every
    save compares per-fqn descriptions, the exchange's detailed path) and
    shared ones: each is saved, the shared ones once; a shared tensor
    whose bytes differ on one rank fails the save on every rank naming its
    fqn; the last good save loads back bit-exact."""
    dist = _init(store, rank, world)
    try:
        g = torch.Generator().manual_seed(100 + rank)
        own = {f"r{rank}.w{i}": torch.rand(16, 256, generator=g) for i in range(3)}
        shared = torch.arange(64 * 256, dtype=torch.float32).reshape(64, 256)
        sd = {"own": own, "shared": {"w": shared.clone(), "step": torch.tensor(3.0),
                                     "epoch": 1},
              "mine": {f"r{rank}.seen": 10 * rank}}
        ckpt.save(sd, checkpoint_id="step-1", job=job, socket=socket)
        exchange = ckpt._checkpointers[next(iter(ckpt._checkpointers))]._exchange
        assert exchange.paths == {"detailed": 1}, exchange.paths
        for t in own.values():
            t.add_(1.0)  # the plan is reused: described again from this memory
        sd["shared"]["epoch"] = 2  # a shared value changes alike on every rank
        sd["mine"][f"r{rank}.seen"] += 1
        ckpt.save(sd, checkpoint_id="step-2", job=job, socket=socket)
        # Nothing but bytes changed: the first exchange's verdict answered.
        assert exchange.paths == {"detailed": 1, "verdict": 1}, exchange.paths
        want = {k: t.clone() for k, t in own.items()}

        if rank == 1:
            sd["shared"]["w"][63, 255] += 1.0
        r = ckpt.async_save(sd, checkpoint_id="step-3", job=job, socket=socket)
        _fails_naming(r.upload_completion, "shared.w", "shared tensor's bytes")
        assert exchange.paths == {"detailed": 2, "verdict": 1}, exchange.paths
        sd["shared"]["w"].copy_(shared)
        sd["shared"]["epoch"] = 3 + rank  # a shared value that disagrees
        r = ckpt.async_save(sd, checkpoint_id="step-3", job=job, socket=socket)
        _fails_naming(r.upload_completion, "shared.epoch", "shared values")
        sd["shared"]["epoch"] = 2
        # A rank's structure changes (a leaf of its own): the holders are
        # found again, and kept for the save after.
        own[f"r{rank}.extra"] = torch.full((4,), float(rank))
        ckpt.save(sd, checkpoint_id="step-3", job=job, socket=socket)
        ckpt.save(sd, checkpoint_id="step-4", job=job, socket=socket)
        assert exchange.paths == {"detailed": 4, "verdict": 2}, exchange.paths

        fresh = {"own": {k: torch.zeros(16, 256) for k in want},
                 "shared": {"w": torch.zeros(64, 256), "step": torch.tensor(0.0), "epoch": 0},
                 "mine": {f"r{rank}.seen": 0}}
        name = ckpt.load(fresh, checkpoint_id="step-2", job=job, socket=socket)
        assert name == "step-2", name
        for k, t in want.items():
            assert torch.equal(fresh["own"][k], t), k
        assert torch.equal(fresh["shared"]["w"], shared)
        assert fresh["shared"]["step"].item() == 3.0
        assert fresh["shared"]["epoch"] == 2 and fresh["mine"] == {f"r{rank}.seen": 10 * rank + 1}
        fresh["own"][f"r{rank}.extra"] = torch.zeros(4)
        assert ckpt.load(fresh, checkpoint_id="latest", job=job, socket=socket) == "step-4"
        assert torch.equal(fresh["own"][f"r{rank}.extra"], own[f"r{rank}.extra"])
    finally:
        dist.destroy_process_group()


def dtensor_plan_rank(socket, store, rank, world, job):
    """One rank with DTensors: the save plan is reused while every DTensor
    keeps its spec (or an equal one) and its local tensor's memory, and
    made afresh when either changes; every checkpoint holds the bytes of
    its save."""
    dist = _init(store, rank, world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    try:
        mesh = init_device_mesh("cpu", (world,))
        w = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)  # saved in place
        sd = {"model": {"w": distribute_tensor(w, mesh, [Shard(0)]),
                        "b": distribute_tensor(torch.ones(8), mesh, [Shard(0)])}}
        c = ckpt.checkpointer(job, socket)

        def save_and_check(name, expect_same_plan):
            before = c._plan
            ckpt.save(sd, checkpoint_id=name, job=job, socket=socket)
            assert (c._plan is before) == expect_same_plan, name
            want = {k: v.full_tensor().clone() for k, v in sd["model"].items()}
            fresh = {"model": {k: distribute_tensor(torch.zeros_like(v), mesh,
                                                    sd["model"][k].placements)
                               for k, v in want.items()}}
            assert ckpt.load(fresh, checkpoint_id=name, job=job, socket=socket) == name
            for k, v in want.items():
                assert torch.equal(fresh["model"][k].full_tensor(), v), (name, k)

        save_and_check("d1", False)
        sd["model"]["w"].to_local().add_(1)  # same memory, new bytes
        sd["model"]["b"].to_local().fill_(2)  # copied at the call
        save_and_check("d2", True)
        # A new DTensor (and spec object) over the same local tensor.
        sd["model"]["w"] = DTensor.from_local(sd["model"]["w"].to_local(), mesh, [Shard(0)])
        save_and_check("d3", True)
        sd["model"]["w"]._local_tensor = sd["model"]["w"].to_local() + 1  # elsewhere
        save_and_check("d4", False)
        # The same memory under another tensor type: found the slow way.
        sd["model"]["w"]._local_tensor = torch.nn.Parameter(sd["model"]["w"].to_local(),
                                                            requires_grad=False)
        save_and_check("d5", True)
        # The same local tensor object, moved to other storage (to_local() would
        # hand out a view).
        sd["model"]["w"]._local_tensor.set_(torch.full((64, 64), 7.0))
        save_and_check("d6", False)
        sd["model"]["w"] = distribute_tensor(torch.full((64, 64), 9.0), mesh, [Replicate()])
        save_and_check("d7", False)
        save_and_check("d8", True)
    finally:
        dist.destroy_process_group()


def save_call_waits_for_no_peer_rank(socket, store, rank, world, job):
    """The save call returns before the other rank has even called its own
    (the replica exchange and the save RPC run on the package's submit
    thread); the save is STAGED and committed once both have. A save
    cancelled before it reached the daemon is cancelled once it does, on
    every rank, and the previous checkpoint stays the latest (the caller's
    daemon has a write cap, so that the commit cannot beat the cancel)."""
    import datetime
    dist = _init(store, rank, world)
    signal = dist.FileStore(store + "-signal", world)
    wait = datetime.timedelta(seconds=60)
    try:
        sd = {f"rank{rank}": torch.full((64, 64), float(rank)), "step": torch.tensor(7.0),
              "epoch": 3}
        ckpt.save(sd, checkpoint_id="first", job=job, socket=socket)  # plans, every rank
        if rank == 0:
            r = ckpt.async_save(sd, checkpoint_id="second", job=job, socket=socket)
            assert not r.staging_completion.done()  # rank 1 has not saved yet
            signal.set("returned", "1")
            r.upload_completion.result()
            r = ckpt.async_save(sd, checkpoint_id="third", job=job, socket=socket)
            r.cancel()  # before rank 1 has saved: not yet submitted
            signal.set("cancelled", "1")
        else:
            try:
                signal.wait(["returned"], wait)
            except Exception as e:  # noqa: BLE001 - a store timeout
                raise AssertionError(f"rank 0's save call waited for rank 1's ({e})")
            ckpt.async_save(sd, checkpoint_id="second", job=job,
                            socket=socket).upload_completion.result()
            signal.wait(["cancelled"], wait)
            r = ckpt.async_save(sd, checkpoint_id="third", job=job, socket=socket)
        try:
            r.upload_completion.result()
            raise AssertionError("a save cancelled before it was submitted committed")
        except ckpt.CkptdError as e:
            # Rank 1's part may find the attempt cancelled at submission; or,
            # arriving after the daemon retired the cancelled attempt, start
            # a new one, which fails once rank 0 leaves without a part (the
            # daemon cannot tell a late part from a retry of the name).
            late = rank == 1 and "disconnected before submitting its part" in str(e)
            assert "cancel" in str(e) or late, str(e)
        fresh = {f"rank{rank}": torch.zeros(64, 64), "step": torch.tensor(0.0), "epoch": 0}
        assert ckpt.load(fresh, checkpoint_id="latest", job=job, socket=socket) == "second"
        assert torch.equal(fresh[f"rank{rank}"], sd[f"rank{rank}"])
        assert fresh["step"].item() == 7.0 and fresh["epoch"] == 3
    finally:
        dist.destroy_process_group()


class WithDaemon(unittest.TestCase):
    """Tests of ckptd.torch against one daemon for the class (it holds no
    test of its own)."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def save(self, sd, name, job):
        ckpt.save(sd, checkpoint_id=name, job=job, socket=self.daemon.socket)

    def load(self, sd, job, name="latest", **kwargs):
        return ckpt.load(sd, checkpoint_id=name, job=job, socket=self.daemon.socket,
                         **kwargs)


class TorchApiTest(WithDaemon):

    def stored_chunks(self, job, name):
        return stored_chunks(self.daemon.socket, job, name)

    def test_a_nested_get_state_dict_with_adamw_round_trips(self):
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        torch.manual_seed(0)
        model = TinyModel()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        train_steps(model, optimizer, 3, seed=1)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "step": 3}
        # Named exactly as DCP flattens them.
        self.assertEqual(sorted(flatten(state)[0]), sorted(flatten_state_dict(state)[0]))
        self.save(state, "step-3", "adamw")
        want = pickle.loads(pickle.dumps(state))  # a deep copy

        torch.manual_seed(1)
        model2 = TinyModel()
        optimizer2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
        model_sd2, optim_sd2 = get_state_dict(model2, optimizer2)
        state2 = {"model": model_sd2, "optim": optim_sd2, "step": 0}
        self.assertEqual(self.load(state2, "adamw"), "step-3")
        assert_same(self, state2, want)
        set_state_dict(model2, optimizer2, model_state_dict=state2["model"],
                       optim_state_dict=state2["optim"])
        for p, q in zip(model.parameters(), model2.parameters()):
            self.assertTrue(torch.equal(p, q))
        # Both continue identically.
        train_steps(model, optimizer, 2, seed=9)
        train_steps(model2, optimizer2, 2, seed=9)
        for p, q in zip(model.parameters(), model2.parameters()):
            self.assertTrue(torch.equal(p, q))

    def test_python_values_of_every_kind_round_trip_large_ones_included(self):
        random.seed(5)
        np.random.seed(5)
        torch.manual_seed(5)
        values = {
            "int": 12345678901234567890, "float": 0.1, "str": "π and ascii",
            "bytes": b"\x00\xff" * 10, "none": None, "tuple": (1, "a", 2.5),
            "list": [1, 2, 3], "nested": {"a": [{"b": 1}], "c": (None,)},
            "py_rng": random.getstate(), "np_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
            "dataloader": {"epoch": 2, "sampler": {"indices": list(range(1000))}},
            # Over the daemon's 64 MiB message limit: streamed as tensor bytes.
            "large": os.urandom(70 << 20),
        }
        self.save({"values": values}, "v1", "values")
        fresh = blank({"values": values})
        self.load(fresh, "values")
        assert_same(self, fresh["values"], values)
        # A second save with other lengths reuses or regrows the buffers.
        values["large"] = b"small now"
        values["list"] = list(range(5000))
        self.save({"values": values}, "v2", "values")
        self.load(fresh, "values")
        assert_same(self, fresh["values"], values)

    def test_non_contiguous_tensors_and_every_shared_dtype_round_trip(self):
        g = torch.Generator().manual_seed(3)
        sd = {}
        for dtype in ALL_DTYPES:
            name = str(dtype)[6:]
            sd[f"t.{name}"] = random_tensor((7, 5), dtype, g).t()  # transposed
            sd[f"s.{name}"] = random_tensor((9, 6), dtype, g)[1::2, ::3]  # strided
            sd[f"scalar.{name}"] = random_tensor((), dtype, g)
            sd[f"empty.{name}"] = torch.empty(0, 3, dtype=dtype)
        want = {k: v.clone() for k, v in sd.items()}
        self.save(sd, "d1", "dtypes")
        fresh = {k: torch.zeros_like(v) if k.startswith("scalar") or k.startswith("empty")
                 else torch.zeros(v.shape[::-1], dtype=v.dtype).t() for k, v in sd.items()}
        self.assertFalse(fresh["t.float32"].is_contiguous())
        self.load(fresh, "dtypes")
        assert_same(self, fresh, want)

    def test_tied_weights_and_views_are_saved_once_and_restored_sharing(self):
        torch.manual_seed(0)
        model = TinyModel(tied=True)
        base = torch.arange(40, dtype=torch.float32)
        sd = {"model": model.state_dict(), "base": base, "row": base.view(5, 8)[2],
              "cols": base.view(5, 8)[:, 1]}
        self.assertEqual(sd["model"]["embed.weight"].data_ptr(),
                         sd["model"]["head.weight"].data_ptr())
        self.save(sd, "t1", "tied")
        index = ckpt.checkpointer("tied", self.daemon.socket)
        result = index.client._client.load("t1", [], ["_ckptd.torch.index"], False)
        from ckptd.index import Index
        aliases = Index.decode(result["byte_items"]["_ckptd.torch.index"]).aliases
        self.assertEqual(sorted(aliases), ["cols", "model.head.weight", "row"])
        # Only the bases' bytes are stored.
        chunks = self.stored_chunks("tied", "t1")
        self.assertIn("base", chunks)
        self.assertIn("model.embed.weight", chunks)
        for alias in aliases:
            self.assertNotIn(alias, chunks)

        torch.manual_seed(1)
        model2 = TinyModel(tied=True)
        sd2 = {"model": model2.state_dict(), "base": torch.zeros(40),
               "row": torch.zeros(8), "cols": torch.zeros(5)}
        self.load(sd2, "tied")
        self.assertEqual(model2.embed.weight.data_ptr(), model2.head.weight.data_ptr())
        self.assertTrue(torch.equal(model2.head.weight, model.head.weight))
        self.assertTrue(torch.equal(sd2["row"], base[16:24]))
        self.assertTrue(torch.equal(sd2["cols"], base.view(5, 8)[:, 1]))
        # An untied destination gets the bytes under both names.
        untied = {"model": TinyModel(tied=False).state_dict()}
        self.load(untied, "tied")
        self.assertTrue(torch.equal(untied["model"]["head.weight"], model.embed.weight))

    def test_a_tensor_dropped_after_async_save_still_saves_its_bytes(self):
        t = torch.arange(48 << 20 >> 2, dtype=torch.float32)  # 48 MiB
        want = t.clone()
        alive = weakref.ref(t)
        sd = {"t": t, "s": torch.ones(3)}
        response = ckpt.async_save(sd, checkpoint_id="k1", job="keep",
                                   socket=self.daemon.socket)
        del sd["t"], t
        gc.collect()
        if not response.staging_completion.done():
            self.assertIsNotNone(alive())  # the response holds it
        scribble = [torch.full((48 << 20 >> 2,), -1.0) for _ in range(2)]
        response.staging_completion.result()
        gc.collect()
        self.assertIsNone(alive())  # released once STAGED
        response.upload_completion.result()
        del scribble
        fresh = {"t": torch.zeros(48 << 20 >> 2), "s": torch.zeros(3)}
        self.load(fresh, "keep")
        self.assertTrue(torch.equal(fresh["t"], want))

    def test_bad_input_fails_the_futures_naming_the_fqn(self):
        response = ckpt.async_save({"a": {"b": torch.zeros(2, dtype=torch.complex128)}},
                                   checkpoint_id="x", job="bad", socket=self.daemon.socket)
        with self.assertRaisesRegex(ckpt.SaveInputError, "a.b: unsupported dtype"):
            response.staging_completion.result()
        with self.assertRaisesRegex(ckpt.SaveInputError, "a.b"):
            response.upload_completion.result()

    def test_replicated_step_scalars_commit_once_and_disagreement_fails(self):
        store = os.path.join(self.daemon.dir, "gloo-replicated")
        self.assertEqual(run_ranks(replicated_state_rank, 2, self.daemon.socket, store,
                                   "replicated"), [0, 0])
        # Each replicated chunk is stored once, the empty shard not at all.
        chunks = self.stored_chunks("replicated", "step-1")
        self.assertEqual(chunks["optim.state.model.tiny.step"], [([], [])])
        self.assertEqual(chunks["optim.state.model.big.step"], [([], [])])
        self.assertEqual(len(chunks["dataloader.epoch"]), 1)
        self.assertEqual(chunks["model.tiny"], [([0, 0], [1, 6])])
        self.assertEqual(sorted(chunks["model.big"]), [([0, 0], [5, 4]), ([5, 0], [5, 4])])
        # One rank of another world loads it all back.
        client = ckptd.Client("replicated", socket=self.daemon.socket)
        whole = {"model.tiny": torch.zeros(1, 6), "model.big": torch.zeros(10, 4),
                 "optim.state.model.tiny.step": torch.zeros(())}
        self.assertEqual(client.load("latest", whole)["checkpoint"], "step-1")
        self.assertTrue(torch.equal(whole["model.big"],
                                    torch.arange(40, dtype=torch.float32).reshape(10, 4)))
        self.assertEqual([c["checkpoint"] for c in client.list() if c["committed"]],
                         ["step-1"])

    def test_plain_tensors_under_each_ranks_own_fqns_save_once_and_shared_ones_are_compared(self):
        store = os.path.join(self.daemon.dir, "gloo-per-rank")
        self.assertEqual(run_ranks(per_rank_plain_rank, 2, self.daemon.socket, store,
                                   "per-rank"), [0, 0])
        for name in ("step-2", "step-4"):  # the verdict path's holders, as found
            chunks = self.stored_chunks("per-rank", name)
            for rank in (0, 1):
                for i in range(3):
                    self.assertEqual(chunks[f"own.r{rank}.w{i}"], [([0, 0], [16, 256])])
            self.assertEqual(chunks["shared.w"], [([0, 0], [64, 256])])
            self.assertEqual(chunks["shared.step"], [([], [])])
            self.assertEqual(len(chunks["shared.epoch"]), 1)
        for rank in (0, 1):
            self.assertEqual(chunks[f"own.r{rank}.extra"], [([0], [4])])

    def test_the_save_plan_is_reused_only_while_the_tensors_stay_where_they_were(self):
        job = "plan"
        big = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)  # saved in place
        sd = {"model": {"w": big, "b": torch.ones(8)}, "rng": torch.get_rng_state(),
              "step": 1}
        c = ckpt.checkpointer(job, self.daemon.socket)

        def save_and_check(name, expect_same_plan):
            before = c._plan
            self.save(sd, name, job)
            self.assertEqual(c._plan is before, expect_same_plan, name)
            want = pickle.loads(pickle.dumps(sd))
            fresh = blank(sd)
            self.assertEqual(self.load(fresh, job, name), name)
            assert_same(self, fresh, want, name)

        save_and_check("p1", False)
        big.add_(1)  # same memory, new bytes
        sd["step"] = 2
        sd["rng"] = torch.get_rng_state()  # a new small tensor: copied, fits the plan
        sd["model"]["b"] = torch.full((8,), 3.0)
        save_and_check("p2", True)
        sd["model"]["w"] = big.clone() + 1  # replaced by a tensor elsewhere
        save_and_check("p3", False)
        sd["model"]["w"].resize_(128, 64)  # reallocated and reshaped in place
        sd["model"]["w"].fill_(5.0)
        save_and_check("p4", False)
        storage_before = sd["model"]["w"].data_ptr()
        sd["model"]["w"].set_(torch.full((128, 64), 7.0))  # same object, other storage
        self.assertNotEqual(sd["model"]["w"].data_ptr(), storage_before)
        save_and_check("p5", False)
        sd["model"]["extra"] = torch.zeros(3)  # another structure
        save_and_check("p6", False)
        save_and_check("p7", True)

    def test_the_save_plan_of_dtensors_is_reused_only_while_spec_and_memory_stay(self):
        store = os.path.join(self.daemon.dir, "gloo-dtensor-plan")
        self.assertEqual(run_ranks(dtensor_plan_rank, 1, self.daemon.socket, store,
                                   "dtensor-plan"), [0])

    def test_the_save_call_returns_before_the_peers_save_and_cancel_reaches_the_daemon(self):
        # Rank 0 cancels its save before the save is submitted; its part
        # reaches the daemon with rank 1's, and the cancel right after.
        # Uncapped, the daemon can commit this small save in that moment
        # (seen once in CI on the loaded 2-core machine): a write cap of
        # its own keeps the commit seconds away, so the test shows that
        # the cancel arrives, not which of the two is faster.
        daemon = Daemon(flags=("--write_rate_limit", str(WRITE_CAP_FOR_CANCEL)))
        try:
            store = os.path.join(daemon.dir, "gloo-submit")
            self.assertEqual(run_ranks(save_call_waits_for_no_peer_rank, 2, daemon.socket,
                                       store, "submit"), [0, 0])
        finally:
            daemon.stop()

    def test_stock_dcp_loads_the_tensors_saved_through_ckptd_torch(self):
        import torch.distributed.checkpoint as dcp
        torch.manual_seed(0)
        model = TinyModel()
        sd = {"model": model.state_dict(), "step": 7}
        self.save(sd, "s1", "stock")
        directory = os.path.join(self.daemon.dir, "root", "stock", "s1")
        want = {f"model.{k}": v for k, v in model.state_dict().items()}
        got = {k: torch.zeros_like(v) for k, v in want.items()}
        dcp.load(got, storage_reader=dcp.HuggingFaceStorageReader(directory))
        assert_same(self, got, want)


if __name__ == "__main__":
    unittest.main()
