"""Errors and recovery as a Python user meets them, against real daemons.

Run by ctest as: python -m unittest test_errors (in this directory), with
PYTHONPATH holding the built package and CKPTD_BINARY the daemon to start.
Each case starts the daemons it needs (one dies, one is restarted).
"""

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch

import ckptd
import ckptd.torch as ckpt
from test_ckptd import Daemon


def start_daemon(socket, root, log_path, pool_bytes=64 << 20, flags=()):
    """A ckptd at `socket` on `root` (more ckptd `flags`); the caller stops it."""
    log = open(log_path, "a")
    process = subprocess.Popen(
        [os.environ["CKPTD_BINARY"], "--socket", socket, "--root", root,
         "--pool_bytes", str(pool_bytes), "--max_sessions", "64", "--max_connections", "256",
         *flags],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while not os.path.exists(socket + ".session"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ckptd did not start; see {log_path}")
        time.sleep(0.02)
    return process


def read_line(stream, timeout):
    """The next line of `stream` (a pipe), or None if none comes in time."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().strip() if ready else None


def wait_stopped(pid, timeout=5):
    """Waits until every thread of `pid` is stopped: SIGSTOP is delivered
    asynchronously, and a thread may still answer a call just after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state == "T" for state in states):
            return
        time.sleep(0.002)
    raise AssertionError(f"process {pid} did not stop")


# A child rank 0 of 2 loading alone: its round waits the daemon's
# --load_batch_ms for rank 1, then runs and writes ones into `w`. Prints
# "interrupted" when Ctrl-C ends the load, then, once the round has had
# time to run, whether `w` is still all zeros.
LOAD_CHILD = """
import time, torch, ckptd
client = ckptd.Client("ctrl-c-load", 0, 2, socket={socket!r}, local_world_size=2)
w = torch.zeros(1 << 20)
print("loading", flush=True)
try:
    client.load("s", {{"w": w}})
    print("loaded", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
time.sleep(6)
print("untouched" if bool((w == 0).all()) else "written", flush=True)
"""


class ErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_no_daemon_names_the_socket_tried_and_how_to_start_one(self):
        socket = os.path.join(tempfile.mkdtemp(prefix="ckptd-none-"), "ckptd.sock")
        started = time.monotonic()
        with self.assertRaises(ckptd.DaemonUnavailable) as caught:
            ckptd.Client("job", socket=socket)
        self.assertLess(time.monotonic() - started, 10)
        message = str(caught.exception)
        self.assertIn(socket, message)
        self.assertIn("ckptd --socket", message)
        with self.assertRaises(ckptd.DaemonUnavailable):
            ckpt.async_save({"w": torch.ones(2)}, checkpoint_id="s", job="job", socket=socket)
        self.assertTrue(issubclass(ckptd.DaemonUnavailable, ckptd.Error))

    def test_a_missing_checkpoint_is_an_error_naming_job_and_checkpoint(self):
        socket = self.daemon.socket
        with self.assertRaises(ckptd.CheckpointNotFound) as caught:
            ckpt.load({"w": torch.zeros(2)}, checkpoint_id="latest", job="empty", socket=socket)
        self.assertIn("'empty'", str(caught.exception))
        self.assertIn("no committed checkpoint", str(caught.exception))
        ckpt.save({"w": torch.ones(2)}, checkpoint_id="step-1", job="found", socket=socket)
        with self.assertRaises(ckptd.CheckpointNotFound) as caught:
            ckpt.load({"w": torch.zeros(2)}, checkpoint_id="step-9", job="found", socket=socket)
        message = str(caught.exception)
        self.assertIn("'found'", message)
        self.assertIn("'step-9'", message)
        self.assertIn("['step-1']", message)  # what there is instead
        client = ckptd.Client("found", socket=socket)
        with self.assertRaises(ckptd.CheckpointNotFound):
            client.load("step-9", {"w": torch.zeros(2)})

    def test_a_shape_or_dtype_mismatch_names_the_fqn_stored_and_found(self):
        socket = self.daemon.socket
        ckpt.save({"model": {"w": torch.ones(4, 4)}}, checkpoint_id="s", job="mismatch",
                  socket=socket)
        with self.assertRaises(ckptd.StateMismatch) as caught:
            ckpt.load({"model": {"w": torch.zeros(4, 5)}}, checkpoint_id="s", job="mismatch",
                      socket=socket)
        e = caught.exception
        self.assertEqual((e.fqn, e.stored, e.found),
                         ("model.w", ("float32", [4, 4]), ("float32", [4, 5])))
        self.assertIn("'model.w'", str(e))
        with self.assertRaises(ckptd.StateMismatch) as caught:
            ckpt.load({"model": {"w": torch.zeros(4, 4, dtype=torch.float64)}},
                      checkpoint_id="s", job="mismatch", socket=socket)
        self.assertEqual((caught.exception.stored, caught.exception.found),
                         (("float32", [4, 4]), ("float64", [4, 4])))
        self.assertIsInstance(caught.exception, ValueError)

    def test_a_daemon_that_dies_mid_save_fails_the_futures_within_seconds(self):
        directory = tempfile.mkdtemp(prefix="ckptd-dies-")
        socket = os.path.join(directory, "ckptd.sock")
        # A pool far smaller than the state: the save streams for a while.
        process = start_daemon(socket, os.path.join(directory, "root"),
                               os.path.join(directory, "ckptd.log"), pool_bytes=16 << 20)
        try:
            state = {f"w{i}": torch.full((8 << 20,), float(i)) for i in range(8)}  # 256 MiB
            response = ckpt.async_save(state, checkpoint_id="s", job="dies", socket=socket)
            process.kill()
            process.wait()
            started = time.monotonic()
            with self.assertRaises(ckptd.DaemonUnavailable) as caught:
                response.upload_completion.result(timeout=30)
            self.assertLess(time.monotonic() - started, 10)
            self.assertIn(socket, str(caught.exception))
            self.assertIn("'s'", str(caught.exception))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            shutil.rmtree(directory, ignore_errors=True)

    def test_ctrl_c_interrupts_a_wait_for_a_save_that_cannot_finish(self):
        # Rank 0 of 2 saves alone: its checkpoint waits for rank 1, which
        # never comes, so wait_committed has nothing to return for. (A
        # daemon of its own: one with a save waiting for a rank is slow to
        # stop, so this one is killed.)
        directory = tempfile.mkdtemp(prefix="ckptd-ctrl-c-")
        socket = os.path.join(directory, "ckptd.sock")
        daemon = start_daemon(socket, os.path.join(directory, "root"),
                              os.path.join(directory, "ckptd.log"))
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(f"""
                import torch, ckptd
                client = ckptd.Client("ctrl-c", 0, 2, socket={socket!r},
                                      local_world_size=2)
                sd = {{"w": torch.ones(1024)}}
                handle = client.save("s", sd)
                handle.wait_staged()
                print("waiting", flush=True)
                handle.wait_committed()
                print("committed", flush=True)
                """)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "waiting")
            time.sleep(0.5)  # inside wait_committed
            child.send_signal(signal.SIGINT)
            started = time.monotonic()
            _, err = child.communicate(timeout=20)
            self.assertLess(time.monotonic() - started, 5)
            self.assertIn("KeyboardInterrupt", err)
            self.assertNotEqual(child.returncode, 0)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            daemon.kill()
            daemon.wait()
            shutil.rmtree(directory, ignore_errors=True)

    def _interrupt_a_load(self, stop_daemon):
        """Starts LOAD_CHILD against a daemon whose rounds wait 4 s, sends it
        SIGINT inside the load (with the daemon SIGSTOPped first if
        `stop_daemon`, resumed 1.5 s later); returns (seconds from SIGINT to
        "interrupted", the child's last line, its stderr)."""
        directory = tempfile.mkdtemp(prefix="ckptd-ctrl-c-load-")
        socket = os.path.join(directory, "ckptd.sock")
        daemon = start_daemon(socket, os.path.join(directory, "root"),
                              os.path.join(directory, "ckptd.log"),
                              flags=("--load_batch_ms", "4000"))
        child = None
        try:
            saver = ckptd.Client("ctrl-c-load", socket=socket)
            saver.save("s", {"w": torch.ones(1 << 20)}).wait_committed()
            child = subprocess.Popen(
                [sys.executable, "-c", LOAD_CHILD.format(socket=socket)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertEqual(read_line(child.stdout, 30), "loading")
            time.sleep(0.5)  # inside load, which waits for its round
            if stop_daemon:
                daemon.send_signal(signal.SIGSTOP)
                wait_stopped(daemon.pid)
            child.send_signal(signal.SIGINT)
            started = time.monotonic()
            line = read_line(child.stdout, 3)
            took = time.monotonic() - started
            if stop_daemon:
                time.sleep(max(0.0, 1.5 - took))
                daemon.send_signal(signal.SIGCONT)
            if line is None:  # not interrupted: the load ends with its round
                line = read_line(child.stdout, 10)
                took = time.monotonic() - started
            self.assertEqual(line, "interrupted")
            last = read_line(child.stdout, 20)
            _, err = child.communicate(timeout=20)
            return took, last, err
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
            daemon.send_signal(signal.SIGCONT)
            daemon.kill()
            daemon.wait()
            shutil.rmtree(directory, ignore_errors=True)

    def test_ctrl_c_interrupts_a_load_at_once_and_no_byte_of_it_is_written_afterwards(self):
        took, last, err = self._interrupt_a_load(stop_daemon=False)
        # The binding checks for signals every 100 ms; the daemon confirms
        # the cancel in milliseconds.
        self.assertLess(took, 1.0, err)
        self.assertNotIn("did not confirm", err)
        self.assertEqual(last, "untouched", err)

    def test_ctrl_c_interrupts_a_load_from_a_stopped_daemon_and_warns_it_may_still_write(self):
        took, last, err = self._interrupt_a_load(stop_daemon=True)
        # The daemon cannot confirm: KeyboardInterrupt comes after the
        # client's cancel_confirm_ms (1 s), with a RuntimeWarning.
        self.assertLess(took, 2.0, err)
        self.assertIn("RuntimeWarning", err)
        self.assertIn("did not confirm", err)
        # Resumed, the daemon sees the load's call cancelled and skips it.
        self.assertEqual(last, "untouched", err)

    def test_a_client_reconnects_to_a_restarted_daemon_on_its_next_call(self):
        directory = tempfile.mkdtemp(prefix="ckptd-restart-")
        socket = os.path.join(directory, "ckptd.sock")
        root = os.path.join(directory, "root")
        log = os.path.join(directory, "ckptd.log")
        process = start_daemon(socket, root, log)
        try:
            state = {"model": {"w": torch.arange(64, dtype=torch.float32)}, "step": 1}
            ckpt.save(state, checkpoint_id="step-1", job="restart", socket=socket)
            client = ckptd.Client("restart-low", socket=socket)
            client.save("a", {"w": torch.ones(3)}).wait_committed()
            process.terminate()
            process.wait(timeout=60)
            process = start_daemon(socket, root, log)
            # The same checkpointer and client, without being told.
            state["model"]["w"] += 1
            state["step"] = 2
            ckpt.save(state, checkpoint_id="step-2", job="restart", socket=socket)
            client.save("b", {"w": torch.full((3,), 2.0)}).wait_committed()
            fresh = {"model": {"w": torch.zeros(64)}, "step": 0}
            self.assertEqual(ckpt.load(fresh, job="restart", socket=socket), "step-2")
            self.assertTrue(torch.equal(fresh["model"]["w"], state["model"]["w"]))
            self.assertEqual(fresh["step"], 2)
            w = {"w": torch.zeros(3)}
            self.assertEqual(client.load("latest", w)["checkpoint"], "b")
            self.assertTrue(torch.equal(w["w"], torch.full((3,), 2.0)))
        finally:
            process.terminate()
            process.wait(timeout=60)
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
