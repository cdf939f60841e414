"""ckptd.torch with the daemon's remote tier (ckptd --remote): the save's
remote_completion future resolves once the checkpoint is committed there,
and a daemon with an empty root (a replacement node) loads "latest" from
the remote tier alone. Against real daemons, the remote tier a directory.

Run by ctest as: python -m unittest test_remote_tier (in this directory),
with PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import os
import shutil
import tempfile
import time
import unittest

import torch

import ckptd
import ckptd.torch as ckpt
from test_ckptd import Daemon


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(256, 130, generator=g),
                      "b": torch.randn(130, generator=g).to(torch.bfloat16)},
            "step": seed}


def zeros_like(sd):
    return {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": 0}


class RemoteTierTest(unittest.TestCase):

    def setUp(self):
        self.remote = tempfile.mkdtemp(prefix="ckptd-remote-")

    def tearDown(self):
        shutil.rmtree(self.remote)

    def test_remote_completion_resolves_and_a_fresh_node_loads_latest_from_the_remote_tier(self):
        first = Daemon(flags=["--remote", self.remote])
        try:
            for step in (1, 2):
                response = ckpt.async_save(state(step), checkpoint_id=f"step-{step}", job="rt",
                                           socket=first.socket)
                response.upload_completion.result(timeout=60)
                upload = response.remote_completion.result(timeout=60)
                self.assertEqual(upload["state"], "committed")
                self.assertEqual(upload["checkpoint"], f"step-{step}")
                self.assertGreater(upload["bytes_total"], 256 * 130 * 4)
                self.assertTrue(os.path.exists(
                    os.path.join(self.remote, "rt", f"step-{step}", "COMMIT")))
        finally:
            first.stop()
        # A replacement node: a new daemon, an empty root, the same remote.
        replacement = Daemon(flags=["--remote", self.remote])
        try:
            got = zeros_like(state(2))
            loaded = ckpt.load(got, checkpoint_id="latest", job="rt",
                               socket=replacement.socket)
            self.assertEqual(loaded, "step-2")
            want = state(2)
            for k in want["model"]:
                self.assertTrue(torch.equal(got["model"][k], want["model"][k]), k)
            self.assertEqual(got["step"], 2)
            # And an older one by name.
            got = zeros_like(state(1))
            ckpt.load(got, checkpoint_id="step-1", job="rt", socket=replacement.socket)
            self.assertTrue(torch.equal(got["model"]["w"], state(1)["model"]["w"]))
        finally:
            replacement.stop()

    def test_a_save_again_replaces_the_checkpoint_in_both_tiers(self):
        """A second save to one checkpoint_id (a new generation, "ck~1")
        commits in the remote tier too, and the replaced one goes from both
        tiers; a replacement node loads the new one by the plain name."""
        first = Daemon(flags=["--remote", self.remote])
        try:
            for step in (1, 2):
                response = ckpt.async_save(state(step), checkpoint_id="ck", job="ow",
                                           socket=first.socket)
                upload = response.remote_completion.result(timeout=60)
                self.assertEqual(upload["checkpoint"], response.storage_name)
            self.assertEqual(response.storage_name, "ck~1")
            # Remote retention runs right after the remote commit; it
            # deletes objects (a directory may stay, empty).
            def objects(name):
                return [f for _, _, files in os.walk(os.path.join(self.remote, "ow", name))
                        for f in files]
            deadline = time.monotonic() + 10
            while objects("ck") and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(objects("ck"), [])
            self.assertTrue(os.path.exists(os.path.join(self.remote, "ow", "ck~1", "COMMIT")))
        finally:
            first.stop()
        replacement = Daemon(flags=["--remote", self.remote])
        try:
            kw = {"job": "ow", "socket": replacement.socket}
            client = ckpt.checkpointer("ow", replacement.socket, None).client
            self.assertEqual([c["checkpoint"] for c in client.list("ck")], ["ck~1"])
            self.assertEqual(ckpt.list_checkpoints(**kw), ["ck"])
            got = zeros_like(state(2))
            self.assertEqual(ckpt.load(got, checkpoint_id="ck", **kw), "ck")
            self.assertTrue(torch.equal(got["model"]["w"], state(2)["model"]["w"]))
            self.assertEqual(got["step"], 2)
        finally:
            replacement.stop()

    def test_a_failed_remote_phase_fails_remote_completion_with_its_reason_and_the_save_stays_committed(self):
        # A file where the job's directory of the remote tier would go.
        with open(os.path.join(self.remote, "rf"), "w") as f:
            f.write("not a directory")
        daemon = Daemon(flags=["--remote", self.remote])
        try:
            response = ckpt.async_save(state(4), checkpoint_id="step-4", job="rf",
                                       socket=daemon.socket)
            response.upload_completion.result(timeout=60)  # committed locally
            error = response.remote_completion.exception(timeout=60)
            self.assertIsInstance(error, ckptd.CkptdError)
            self.assertIn("node 0", str(error))
            self.assertIn(os.path.join(self.remote, "rf"), str(error))
            progress = response.progress()
            self.assertEqual(progress["phase"], "COMMITTED")
            self.assertEqual(progress["remote_phase"], "REMOTE_FAILED")
            self.assertIn("node 0", progress["remote_reason"])
            got = zeros_like(state(4))
            ckpt.load(got, checkpoint_id="step-4", job="rf", socket=daemon.socket)
            self.assertTrue(torch.equal(got["model"]["w"], state(4)["model"]["w"]))
        finally:
            daemon.stop()

    def test_without_a_remote_tier_remote_completion_fails_saying_so(self):
        daemon = Daemon()
        try:
            response = ckpt.async_save(state(3), checkpoint_id="step-3", job="rt",
                                       socket=daemon.socket)
            response.upload_completion.result(timeout=60)
            error = response.remote_completion.exception(timeout=60)
            self.assertIsInstance(error, ckptd.CkptdError)
            self.assertIn("no remote tier", str(error))
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
