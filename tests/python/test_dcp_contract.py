"""ckptd.torch keeps torch.distributed.checkpoint's contract (docs/DCP.md):
Stateful objects at any depth, DCP's exception type and missing-key report,
allow_partial_load, listing checkpoints, $CKPTD_SOCKET, ranks that name
different checkpoints failing fast, and a save again to a checkpoint_id
replacing it atomically. Against a real daemon.

Run by ctest as: python -m unittest test_dcp_contract (in this directory),
with PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import os
import time
import unittest

import torch
from torch.distributed.checkpoint.api import CheckpointException

import ckptd
import ckptd.torch as ckpt
from test_ckptd import Daemon, run_ranks
from test_torch_api import TinyModel, WithDaemon, _init, assert_same, train_steps


class AppState:
    """An application object with DCP's Stateful methods and a plain
    attribute: what torchtitan's TrainState is like."""

    def __init__(self, step=0, tokens=0):
        self.step = step
        self.tokens = tokens
        self.loaded = 0  # load_state_dict calls

    def state_dict(self):
        return {"step": self.step, "tokens": torch.tensor(self.tokens)}

    def load_state_dict(self, sd):
        self.step = sd["step"]
        self.tokens = int(sd["tokens"])
        self.loaded += 1


class Wrapper:
    """A Stateful whose state_dict holds another Stateful (a container of
    optimizers, say)."""

    def __init__(self, inner):
        self.inner = inner
        self.given = None

    def state_dict(self):
        return {"inner": self.inner, "version": 3}

    def load_state_dict(self, sd):
        self.given = sd


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class DcpContractTest(WithDaemon):

    def test_stateful_model_and_optimizer_are_restored_not_replaced(self):
        """The silent wrong resume: a picklable nn.Module, an optimizer and
        an application object passed as DCP passes them. The load must
        restore the live objects' state (not replace the dict's entries by
        unpickled copies, leaving the model at its later weights)."""
        torch.manual_seed(0)
        model = TinyModel()
        optim = torch.optim.AdamW(model.parameters(), lr=0.01)
        train_steps(model, optim, 2, seed=1)
        app = AppState(step=2, tokens=4096)
        sd = {"model": model, "optimizer": optim, "app": app}
        self.save(sd, "step-2", "stateful")
        saved_model, saved_optim = snapshot(model), optim.state_dict()
        saved_optim = {"state": {k: {n: t.clone() for n, t in v.items()}
                                 for k, v in saved_optim["state"].items()},
                       "param_groups": saved_optim["param_groups"]}

        train_steps(model, optim, 3, seed=2)  # the run goes on, then fails
        app.step, app.tokens = 5, 9999
        self.assertFalse(all(torch.equal(a, b) for a, b in
                             zip(snapshot(model).values(), saved_model.values())))

        self.assertEqual(self.load(sd, "stateful"), "step-2")
        self.assertIs(sd["model"], model)
        self.assertIs(sd["optimizer"], optim)
        self.assertIs(sd["app"], app)
        assert_same(self, snapshot(model), saved_model, "model")
        got = optim.state_dict()
        assert_same(self, got["state"], saved_optim["state"], "optimizer.state")
        self.assertEqual(got["param_groups"], saved_optim["param_groups"])
        self.assertEqual((app.step, app.tokens, app.loaded), (2, 4096, 1))

        # The resumed run goes on exactly as the uninterrupted one would.
        torch.manual_seed(0)
        reference = TinyModel()
        reference_optim = torch.optim.AdamW(reference.parameters(), lr=0.01)
        train_steps(reference, reference_optim, 2, seed=1)
        train_steps(reference, reference_optim, 1, seed=7)
        train_steps(model, optim, 1, seed=7)
        assert_same(self, snapshot(model), snapshot(reference), "resumed")

    def test_stateful_at_any_depth_and_nested_in_a_stateful(self):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3)
        app, inner = AppState(1, 10), AppState(7, 70)
        wrapper = Wrapper(inner)
        sd = {"train": {"parts": [model, {"app": app}], "epoch": 4},
              "wrapped": wrapper, "plain": {"w": torch.arange(6.0)}}
        saved = snapshot(model)
        self.save(sd, "deep", "depth")
        # The user's containers were not changed by the save.
        self.assertIs(sd["train"]["parts"][0], model)
        self.assertIs(sd["train"]["parts"][1]["app"], app)
        self.assertIs(sd["wrapped"], wrapper)

        with torch.no_grad():
            model.weight.zero_()
            model.bias.fill_(5)
        app.step, inner.step = 0, 0
        sd["train"]["epoch"] = 0
        sd["plain"]["w"].zero_()
        self.load(sd, "depth")

        assert_same(self, snapshot(model), saved, "model")
        self.assertEqual((app.step, app.tokens, inner.step, inner.tokens), (1, 10, 7, 70))
        # A plain value is replaced in the user's own container, as DCP does.
        self.assertEqual(sd["train"]["epoch"], 4)
        self.assertTrue(torch.equal(sd["plain"]["w"], torch.arange(6.0)))
        # The parent is given its children back as the objects, restored first.
        self.assertIs(wrapper.given["inner"], inner)
        self.assertEqual(wrapper.given["version"], 3)
        self.assertEqual(inner.loaded, 1)
        self.assertIs(sd["train"]["parts"][0], model)

    def test_stock_dcp_reads_a_stateful_save_under_dcp_names(self):
        """A model saved as a Stateful is stored under the fqns DCP gives
        it ("model.weight"), so a plain state dict loads it too."""
        model = torch.nn.Linear(5, 2)
        self.save({"model": model}, "as-dcp", "names")
        plain = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
        self.load(plain, "names")
        assert_same(self, plain["model"], snapshot(model), "model")

    def test_plan_is_reused_when_saving_the_same_stateful_objects(self):
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
        app = AppState(1, 1)
        sd = {"model": model, "app": app}
        c = ckpt.checkpointer("plan-reuse", self.daemon.socket)
        self.save(sd, "a", "plan-reuse")
        plan = c._plan
        app.step = 2
        self.save(sd, "b", "plan-reuse")
        self.assertIs(c._plan, plan)
        app.step = 0
        self.load(sd, "plan-reuse")
        self.assertEqual(app.step, 2)
        # A value leaf that becomes a Stateful object is not pickled as a
        # value by a matched plan: it is asked for its state.
        plain = {"app": 5, "w": torch.ones(3)}
        self.save(plain, "c", "plan-reuse-2")
        plain["app"] = AppState(3, 3)
        self.save(plain, "d", "plan-reuse-2")
        fresh = {"app": AppState(), "w": torch.zeros(3)}
        self.load(fresh, "plan-reuse-2")
        self.assertEqual((fresh["app"].step, fresh["app"].tokens), (3, 3))

    def test_errors_are_dcp_checkpoint_exceptions(self):
        with self.assertRaises(CheckpointException) as e:
            self.load({"w": torch.zeros(2)}, "no-such-job")
        self.assertIsInstance(e.exception, ckpt.CheckpointNotFound)
        self.assertIsInstance(e.exception, ckptd.CkptdError)
        self.assertIsInstance(e.exception, Exception)
        self.assertIn("no-such-job", str(e.exception))
        self.assertEqual(e.exception.failures, {})

    def test_missing_keys_as_dcp_reports_them_and_partial_load(self):
        self.save({"a": torch.arange(4.0), "v": 1}, "s", "missing")
        sd = {"a": torch.zeros(4), "b": torch.full((2,), 7.0), "v": None}
        with self.assertRaises(ckpt.MissingKeys) as e:
            self.load(sd, "missing")
        self.assertIsInstance(e.exception, CheckpointException)
        self.assertTrue(str(e.exception).startswith(
            "Missing key in checkpoint state_dict: b."), str(e.exception))
        # Refused before any byte was written.
        self.assertTrue(torch.equal(sd["a"], torch.zeros(4)))
        self.assertIsNone(sd["v"])
        missing_value = {"a": torch.zeros(4), "u": 3}
        with self.assertRaises(ckpt.MissingKeys) as e:
            self.load(missing_value, "missing")
        self.assertEqual(e.exception.keys, ["u"])

        self.load(sd, "missing", allow_partial_load=True)
        self.assertTrue(torch.equal(sd["a"], torch.arange(4.0)))
        self.assertTrue(torch.equal(sd["b"], torch.full((2,), 7.0)))
        self.assertEqual(sd["v"], 1)

    def test_meta_device_state_is_refused_with_the_way_out(self):
        """As in DCP, a load fills allocated tensors; a model built on the
        meta device gets an error that says so, and nothing is loaded."""
        self.save({"model": torch.nn.Linear(3, 2)}, "m", "meta")
        with torch.device("meta"):
            meta_model = torch.nn.Linear(3, 2)
        with self.assertRaises(ckpt.InvalidStateDict) as e:
            self.load({"model": meta_model}, "meta")
        self.assertIsInstance(e.exception, CheckpointException)
        self.assertIn("model.weight", str(e.exception))
        self.assertIn("to_empty", str(e.exception))
        meta_model.to_empty(device="cpu")
        self.load({"model": meta_model}, "meta")

    def test_list_and_latest_checkpoint(self):
        job = "listing"
        kw = {"job": job, "socket": self.daemon.socket}
        self.assertEqual(ckpt.list_checkpoints(**kw), [])
        self.assertIsNone(ckpt.latest_checkpoint(**kw))
        for name in ("step-3", "step-1", "step-2"):  # commit order, not name order
            self.save({"w": torch.ones(2)}, name, job)
        self.assertEqual(ckpt.list_checkpoints(**kw), ["step-3", "step-1", "step-2"])
        self.assertEqual(ckpt.latest_checkpoint(**kw), "step-2")

    def test_a_path_checkpoint_id_maps_to_a_job_and_a_name_reversibly(self):
        from ckptd import checkpoint_ids
        folder = os.path.join(self.daemon.dir, "runs", "llama_7b..v2")
        kw = {"socket": self.daemon.socket}
        ckpt.save({"w": torch.arange(3.0)}, checkpoint_id=f"{folder}/step-1", **kw)
        ckpt.save({"w": torch.arange(4.0)}, checkpoint_id=f"{folder}/step-2", **kw)
        self.assertEqual(ckpt.list_checkpoints(folder=folder, **kw), ["step-1", "step-2"])
        job, name = checkpoint_ids.resolve(f"{folder}/step-2", None)
        self.assertEqual(name, "step-2")
        self.assertTrue(job.startswith(checkpoint_ids.PATH_JOB_PREFIX), job)
        self.assertEqual(checkpoint_ids.checkpoint_path(job, name), f"{folder}/step-2")
        self.assertEqual(ckpt.latest_checkpoint(job=job, **kw), "step-2")
        sd = {"w": torch.zeros(3)}
        self.assertEqual(ckpt.load(sd, checkpoint_id=f"{folder}/step-1", **kw), "step-1")
        self.assertTrue(torch.equal(sd["w"], torch.arange(3.0)))
        latest = {"w": torch.zeros(4)}
        ckpt.load(latest, checkpoint_id=os.path.join(folder, "latest"), **kw)
        self.assertTrue(torch.equal(latest["w"], torch.arange(4.0)))
        # A plain name is a name, and a job named by hand is no path.
        self.assertEqual(checkpoint_ids.resolve("step-1", "llama"), ("llama", "step-1"))
        self.assertIsNone(checkpoint_ids.checkpoint_path("llama", "step-1"))
        # Refused with the rule: a name that cannot be stored, a job= that
        # contradicts the path.
        with self.assertRaises(CheckpointException) as e:
            ckpt.save({"w": torch.ones(1)}, checkpoint_id=f"{folder}/step 3", **kw)
        self.assertIn("[A-Za-z0-9._-]", str(e.exception))
        with self.assertRaisesRegex(ckpt.SaveInputError, "pass one or the other"):
            ckpt.save({"w": torch.ones(1)}, checkpoint_id=f"{folder}/step-3",
                      job="other", **kw)

    def test_socket_from_the_environment(self):
        os.environ["CKPTD_SOCKET"] = self.daemon.socket
        try:
            ckpt.save({"w": torch.ones(3)}, checkpoint_id="env", job="env-socket")
            self.assertEqual(ckpt.latest_checkpoint(job="env-socket"), "env")
        finally:
            del os.environ["CKPTD_SOCKET"]

    def test_ranks_that_name_different_checkpoints_fail_fast(self):
        store = os.path.join(self.daemon.dir, "names-store")
        start = time.monotonic()
        self.assertEqual(run_ranks(different_names_rank, 2, self.daemon.socket, store),
                         [0, 0])
        # The daemon's wait for the local ranks is 10 minutes; the exchange
        # finds the difference at once (process start-up dominates).
        self.assertLess(time.monotonic() - start, 120)


class GenerationNamesTest(unittest.TestCase):
    """generations.py's name rule, as common/names.h has it."""

    def test_split_and_storage_name(self):
        from ckptd import generations as g
        self.assertEqual(g.split("step-1~3"), ("step-1", 3))
        self.assertEqual(g.split("step-1"), ("step-1", 0))
        for plain in ("x~", "x~0", "x~01", "~1", "x~1a", "x~1234567890123456789"):
            self.assertEqual(g.split(plain), (plain, 0), plain)
        self.assertEqual(g.storage_name("a", 0), "a")
        self.assertEqual(g.storage_name("a", 7), "a~7")
        with self.assertRaisesRegex(ValueError, "shorter name"):
            g.storage_name("a" * 127, 10)

    def test_decide_lists_once_then_counts_its_own_saves(self):
        from ckptd import generations as g
        calls = []

        def listing():
            calls.append(1)
            return [{"checkpoint": "a", "committed": True},
                    {"checkpoint": "a~4", "committed": False},  # a remnant: not reused
                    {"checkpoint": "b~2", "committed": False}]
        gens = g.Generations()
        self.assertEqual(gens.decide("a", True, listing), 5)
        self.assertEqual(gens.decide("a", False, listing), g.EXISTS)
        self.assertEqual(gens.decide("b", False, listing), 3)  # never committed
        self.assertEqual(gens.decide("new", False, listing), 0)
        gens.given("new", 0)
        self.assertEqual(gens.decide("new", True, listing), 1)
        self.assertEqual(gens.decide("new", False, listing), g.EXISTS)
        self.assertEqual(len(calls), 1)

    def test_readers_see_the_newest_committed_generation(self):
        from ckptd import generations as g
        entries = [{"checkpoint": "a", "committed": True, "committed_unix_micros": 1},
                   {"checkpoint": "a~1", "committed": True, "committed_unix_micros": 5},
                   {"checkpoint": "a~2", "committed": False, "committed_unix_micros": 0},
                   {"checkpoint": "b", "committed": True, "committed_unix_micros": 3}]
        self.assertEqual(g.newest_committed(entries, "a")["checkpoint"], "a~1")
        self.assertIsNone(g.newest_committed(entries, "c"))
        self.assertEqual([e["checkpoint"] for e in g.visible(entries)], ["b", "a~1"])


class OverwriteTest(unittest.TestCase):
    """A save to a checkpoint_id already saved replaces it as DCP's writer
    does, but atomically (generations.py): against a daemon whose writes are
    paced, so that the new save is long in flight."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(flags=("--write_rate_limit", str(8 << 20)))

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def stored(self, job, name, want=None):
        """The daemon's names of `name` and its generations; with `want`,
        once they are that or after 10 s (retention runs right after the
        commit the save reports)."""
        client = ckpt.checkpointer(job, self.daemon.socket, None).client
        deadline = time.monotonic() + 10
        while True:
            names = sorted(c["checkpoint"] for c in client.list(name))
            if want is None or names == want or time.monotonic() > deadline:
                return names
            time.sleep(0.02)

    def test_readers_see_the_old_checkpoint_until_the_new_one_commits(self):
        kw = {"job": "overwrite", "socket": self.daemon.socket}
        n = 4 << 20  # 16 MiB: 2 s at the paced rate
        ckpt.save({"w": torch.full((n,), 1.0)}, checkpoint_id="ck", **kw)
        r = ckpt.async_save({"w": torch.full((n,), 2.0)}, checkpoint_id="ck", **kw)
        r.staging_completion.result(timeout=60)
        seen = []
        while not r.upload_completion.done():
            sd = {"w": torch.zeros(n)}
            self.assertEqual(ckpt.load(sd, checkpoint_id="ck", **kw), "ck")
            # One checkpoint or the other, whole: never a mixture.
            self.assertTrue(torch.all(sd["w"] == sd["w"][0]))
            seen.append(float(sd["w"][0]))
        r.upload_completion.result()
        self.assertIn(1.0, seen)
        self.assertTrue(set(seen) <= {1.0, 2.0}, seen)
        self.assertEqual(r.storage_name, "ck~1")
        sd = {"w": torch.zeros(n)}
        ckpt.load(sd, checkpoint_id="ck", **kw)
        self.assertTrue(torch.all(sd["w"] == 2.0))
        ckpt.load(sd := {"w": torch.zeros(n)}, checkpoint_id="latest", **kw)
        self.assertTrue(torch.all(sd["w"] == 2.0))
        self.assertEqual(ckpt.list_checkpoints(**kw), ["ck"])
        self.assertEqual(ckpt.latest_checkpoint(**kw), "ck")
        # The old one's space is reclaimed once no load reads it: at the
        # commit, or at the next one if a load held it then.
        ckpt.save({"w": torch.ones(1)}, checkpoint_id="tick", **kw)
        self.assertEqual(self.stored("overwrite", "ck", ["ck~1"]), ["ck~1"])
        self.assertFalse(os.path.exists(os.path.join(self.daemon.dir, "root", "overwrite", "ck")))

        # Again: a third generation replaces the second.
        ckpt.save({"w": torch.full((n,), 3.0)}, checkpoint_id="ck", **kw)
        self.assertEqual(self.stored("overwrite", "ck", ["ck~2"]), ["ck~2"])
        ckpt.load(sd := {"w": torch.zeros(n)}, checkpoint_id="ck", **kw)
        self.assertTrue(torch.all(sd["w"] == 3.0))
        self.assertEqual(ckpt.list_checkpoints(**kw), ["tick", "ck"])

    def test_a_load_whose_generation_goes_between_its_two_requests_starts_again(self):
        """A load reads the index, then the tensors; retention may delete the
        generation in between (a newer one committed). The daemon refuses
        the second request before writing a byte, and the load starts again
        from the newest generation. The deletion is stood for by the first
        tensors request failing as the daemon's would."""
        kw = {"job": "replaced-mid-load", "socket": self.daemon.socket}
        ckpt.save({"w": torch.full((8,), 1.0)}, checkpoint_id="ck", **kw)
        ckpt.save({"w": torch.full((8,), 2.0)}, checkpoint_id="ck", **kw)
        client = ckpt.checkpointer(kw["job"], self.daemon.socket, None).client
        real, calls = client._load, []

        def load_once_replaced(name, items, byte_items, allow_missing):
            calls.append((name, bool(items)))
            if items and sum(1 for _, with_items in calls if with_items) == 1:
                raise ckpt.CheckpointNotFound(f"job has no committed checkpoint {name!r}")
            return real(name, items, byte_items, allow_missing)
        client._load = load_once_replaced
        try:
            sd = {"w": torch.zeros(8)}
            self.assertEqual(ckpt.load(sd, checkpoint_id="ck", **kw), "ck")
        finally:
            del client._load
        self.assertTrue(torch.all(sd["w"] == 2.0))
        self.assertEqual(calls, [("ck~1", False), ("ck~1", True), ("ck~1", False),
                                 ("ck~1", True)])

    def test_overwrite_false_refuses_a_taken_name_and_keeps_it(self):
        kw = {"job": "no-overwrite", "socket": self.daemon.socket}
        ckpt.save({"w": torch.full((8,), 1.0)}, checkpoint_id="ck", **kw)
        with self.assertRaises(ckpt.CheckpointExists) as e:
            ckpt.save({"w": torch.full((8,), 2.0)}, checkpoint_id="ck", overwrite=False, **kw)
        self.assertIsInstance(e.exception, CheckpointException)
        self.assertIn("Checkpoint already exists", str(e.exception))
        sd = {"w": torch.zeros(8)}
        ckpt.load(sd, checkpoint_id="ck", **kw)
        self.assertTrue(torch.all(sd["w"] == 1.0))
        self.assertEqual(self.stored("no-overwrite", "ck"), ["ck"])
        # A free name saves with overwrite=False as with True.
        ckpt.save({"w": torch.ones(8)}, checkpoint_id="fresh", overwrite=False, **kw)
        self.assertEqual(ckpt.list_checkpoints(**kw), ["ck", "fresh"])


def different_names_rank(socket, store, rank, world):
    """Rank 1 saves under another job, then under another checkpoint name:
    both ranks fail in the exchange, naming the names."""
    dist = _init(store, rank, world)
    try:
        sd = {"w": torch.ones(4)}
        r = ckpt.async_save(sd, checkpoint_id="step-1", job=f"names-{rank}", socket=socket)
        try:
            r.upload_completion.result(timeout=60)
            raise AssertionError("ranks saving under different jobs succeeded")
        except ckpt.SaveInputError as e:
            assert "'names-0'" in str(e) and "'names-1'" in str(e), str(e)
        r = ckpt.async_save(sd, checkpoint_id=f"step-{time.time_ns() + rank}",
                            job="names", socket=socket)
        try:
            r.upload_completion.result(timeout=60)
            raise AssertionError("ranks saving under different names succeeded")
        except ckpt.SaveInputError as e:
            assert "different names" in str(e), str(e)
        ckpt.save(sd, checkpoint_id="agreed", job="names", socket=socket)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
