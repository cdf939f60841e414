"""examples/train_fsdp.py runs as the README writes it: the commands of the
README's block that runs the example, in order, against a real daemon; the
first run saves every step on 4 ranks (HSDP), the second resumes on 2.

Run by ctest as: python -m unittest test_example_train_fsdp (in this
directory), with PYTHONPATH holding the built package, CKPTD_BINARY the
daemon and CKPTCTL_BINARY the CLI.

The block's commands are taken from README.md itself, so the README cannot
drift from what is tested. Three things differ from a user's shell, and only
these: the daemon is the test's own (the block's socket is replaced by the
test daemon's), the interpreter is this one, and PYTHONPATH and the
binaries are the build's under test rather than build/.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import unittest

from test_ckptd import Daemon

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = "examples/train_fsdp.py"


def readme_commands():
    """The commands of the README's fenced sh block that runs EXAMPLE,
    each as its argv (continuation lines joined, comments dropped)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if EXAMPLE in b]
    if len(blocks) != 1:
        raise AssertionError(f"README.md has {len(blocks)} sh blocks running {EXAMPLE}")
    joined = blocks[0].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if shlex.split(line, comments=True)]


class ExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.addClassCleanup(cls.daemon.stop)

    def with_our_socket(self, args):
        """`args` with the value of --socket replaced by the test daemon's."""
        self.assertIn("--socket", args)
        at = args.index("--socket") + 1
        return args[:at] + [self.daemon.socket] + args[at + 1:]

    def run_readme_command(self, argv):
        """Runs one command of the block; returns its stdout, or None for a
        command the test stands in for (the daemon, its directory, kill)."""
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
            self.assertEqual(argv[0], "PYTHONPATH=build/python")  # ours: the build's
            argv = argv[1:]
        program, args = argv[0], argv[1:]
        if program in ("mkdir", "kill") or program == "build/daemon/ckptd":
            return None
        if program == ".venv/bin/python":
            self.assertEqual(args[0], EXAMPLE)
            command = [sys.executable, os.path.join(ROOT, EXAMPLE),
                       *self.with_our_socket(args[1:])]
        elif program == "build/client/ckptctl":
            command = [os.environ["CKPTCTL_BINARY"], *self.with_our_socket(args)]
        else:
            self.fail(f"README's example block runs {program!r}, which this test "
                      "does not know how to run")
        r = subprocess.run(command, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, f"{shlex.join(argv)}\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def test_the_readme_block_trains_saves_on_4_ranks_and_resumes_on_2(self):
        commands = readme_commands()
        outputs = [out for out in map(self.run_readme_command, commands) if out is not None]
        self.assertEqual(len(outputs), 3, "two training runs and ckptctl list")
        first, second, listed = outputs

        def losses(out):
            return {int(s): float(x) for s, x in re.findall(r"^step (\d+)  loss ([\d.]+)",
                                                            out, re.M)}
        self.assertIn("no checkpoint yet: job 'tiny-transformer', 4 ranks, "
                      "training steps 1..4", first)
        self.assertEqual(sorted(losses(first)), [1, 2, 3, 4])
        self.assertIn("step-00000004 committed", first)
        self.assertIn("resumed from step-00000004: job 'tiny-transformer', 2 ranks, "
                      "training steps 5..8", second)
        self.assertEqual(sorted(losses(second)), [5, 6, 7, 8])
        self.assertIn("step-00000008 committed", second)
        # It learns across the resume (the sequences are predictable).
        self.assertLess(losses(second)[8], losses(first)[1] - 0.5)
        self.assertIn("step-00000008", listed)

        # Every step committed, by the world size that saved it.
        out = subprocess.run([os.environ["CKPTCTL_BINARY"], "--socket", self.daemon.socket,
                              "list", "--json", "tiny-transformer"], capture_output=True,
                             text=True, check=True).stdout
        checkpoints = json.loads(out)["checkpoints"]
        self.assertEqual([(c["checkpoint"], c["committed"], c["world_size"])
                          for c in checkpoints],
                         [(f"step-{s:08d}", True, 4 if s <= 4 else 2) for s in range(1, 9)])
        self.assertEqual([c["checkpoint"] for c in checkpoints if c["latest"]],
                         ["step-00000008"])


if __name__ == "__main__":
    unittest.main()
