"""`ckptctl export --format hf`: the model weights of a checkpoint that two
ranks saved as FSDP shards come out as whole tensors in safetensors files
that the `safetensors` package opens, with an index naming every tensor's
file, and every tensor equal to the saved one.

Run by ctest as: python -m unittest test_hf_export (in this directory), with
PYTHONPATH holding the built package, CKPTD_BINARY the daemon and
CKPTCTL_BINARY the CLI.
"""

import json
import os
import stat
import subprocess
import tempfile
import unittest

import torch
from safetensors import safe_open

import ckptd.torch as ckpt
from test_ckptd import Daemon, run_ranks
from test_torch_api import _init


def model_state(generator):
    """What both ranks save under "model." (full tensors; the ranks shard
    some of them). Rows are chosen so that slices of the 4 KiB load buffer
    cut them, and one has a single row (rank 1's shard is empty)."""
    return {
        "embed.weight": torch.randn(97, 24, generator=generator).to(torch.bfloat16),
        "layers.0.attn.weight": torch.randn(40, 40, generator=generator),
        "layers.0.norm.bias": torch.randn(40, generator=generator).to(torch.float16),
        "lm_head.weight": torch.randn(1, 24, generator=generator).double(),
        "counts": torch.randint(0, 1 << 40, (33,), generator=generator),
        "scale": torch.tensor(0.5),
    }


SHARDED = {"embed.weight", "layers.0.attn.weight", "lm_head.weight"}


def save_rank(socket, store, rank, world, job):
    dist = _init(store, rank, world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    try:
        mesh = init_device_mesh("cpu", (world,))
        full = model_state(torch.Generator().manual_seed(7))
        model = {k: distribute_tensor(v, mesh, [Shard(0)]) if k in SHARDED else v
                 for k, v in full.items()}
        sd = {"model": model,
              "optim": {"state": {"embed.weight": {"exp_avg": torch.ones(3)}}},
              "step": 12}
        ckpt.save(sd, checkpoint_id="step-12", job=job, socket=socket)
    finally:
        dist.destroy_process_group()


class HfExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.store = tempfile.mktemp(prefix="ckptd-hf-store-")
        codes = run_ranks(save_rank, 2, cls.daemon.socket, cls.store, "hf")
        assert codes == [0, 0], codes

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def ctl(self, *args):
        return subprocess.run([os.environ["CKPTCTL_BINARY"], "--socket", self.daemon.socket,
                               *args], capture_output=True, text=True, timeout=300)

    def test_export_writes_whole_tensors_in_bounded_files_with_an_index(self):
        out = os.path.join(tempfile.mkdtemp(prefix="ckptd-hf-"), "export")
        # Small files and a small buffer: several files, and tensors loaded
        # in dim-0 slices and several to a load.
        r = self.ctl("export", "hf", "--format", "hf", "--out", out,
                     "--max_file_bytes", "6KiB", "--buffer_bytes", "4KiB")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("exported 6 tensors", r.stdout)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        want = model_state(torch.Generator().manual_seed(7))
        self.assertEqual(set(index["weight_map"]), set(want))
        self.assertEqual(index["metadata"]["total_size"],
                         sum(t.numel() * t.element_size() for t in want.values()))
        files = sorted(set(index["weight_map"].values()))
        self.assertGreater(len(files), 1)
        self.assertEqual(sorted(os.listdir(out)),
                         sorted(files + ["model.safetensors.index.json"]))
        for i, name in enumerate(files):
            self.assertEqual(name, f"model-{i + 1:05d}-of-{len(files):05d}.safetensors")
        # The job's protection kept (its directory is its owner's alone):
        # files 0600, the directory the export made 0700; was 0644 and 0755.
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o700)
        for name in os.listdir(out):
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(out, name)).st_mode), 0o600,
                             name)
        seen = set()
        for name in files:
            with safe_open(os.path.join(out, name), framework="pt") as f:
                self.assertEqual(f.metadata(), {"format": "pt"})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            in_file = sum(t.numel() * t.element_size() for t in tensors.values())
            # Bounded, but a tensor larger than the bound has a file alone.
            self.assertTrue(in_file <= 6 * 1024 or len(tensors) == 1, name)
            for k, t in tensors.items():
                self.assertEqual(index["weight_map"][k], name)
                self.assertEqual(t.dtype, want[k].dtype, k)
                self.assertEqual(t.shape, want[k].shape, k)
                self.assertTrue(torch.equal(t, want[k]), k)
                seen.add(k)
        self.assertEqual(seen, set(want))

    def test_export_refuses_a_directory_that_is_not_empty_and_touches_nothing(self):
        out = tempfile.mkdtemp(prefix="ckptd-hf-busy-")
        mine = os.path.join(out, "model-00001-of-00001.safetensors")
        with open(mine, "w") as f:
            f.write("the user's own file")
        r = self.ctl("export", "hf", "--format", "hf", "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not empty", r.stderr)
        with open(mine) as f:
            self.assertEqual(f.read(), "the user's own file")
        self.assertEqual(os.listdir(out), ["model-00001-of-00001.safetensors"])

    def test_root_export_refuses_a_symlink_another_user_planted_and_writes_nothing(self):
        # A user's ~/out -> /root-only-dir: root's export wrote the user's
        # choice of files into a directory the user may not write.
        if os.geteuid() != 0:
            self.skipTest("needs root (to make another user's directory and link)")
        user = 61005  # made up: no passwd entry is needed to own files
        base = tempfile.mkdtemp(prefix="ckptd-hf-planted-")
        home = os.path.join(base, "home")
        target = os.path.join(base, "root-only")
        os.mkdir(home)
        os.chown(home, user, user)
        os.mkdir(target, 0o700)
        link = os.path.join(home, "out")
        os.symlink(target, link)
        os.lchown(link, user, user)
        for out in (link, os.path.join(link, "sub"), os.path.join(link, ".")):
            r = self.ctl("export", "hf", "--format", "hf", "--out", out)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(f"refusing --out {out}: {link} is a symbolic link of uid {user}",
                          r.stderr)
            self.assertEqual(os.listdir(target), [])
        # Root's own link (in root's directory) is still followed, and a
        # real directory of the user's is still written.
        mine = os.path.join(base, "mine")
        os.symlink(target, mine)
        r = self.ctl("export", "hf", "--format", "hf", "--out", os.path.join(mine, "x"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("model.safetensors.index.json", os.listdir(os.path.join(target, "x")))
        real = os.path.join(home, "real")
        os.mkdir(real)
        os.chown(real, user, user)
        r = self.ctl("export", "hf", "--format", "hf", "--out", real)
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in os.listdir(real):
            st = os.stat(os.path.join(real, name))
            self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (0, 0o600), name)

    def test_export_names_the_buffer_a_row_needs_and_leaves_no_files(self):
        out = os.path.join(tempfile.mkdtemp(prefix="ckptd-hf-small-"), "export")
        # A row of layers.0.attn.weight is 160 bytes.
        r = self.ctl("export", "hf", "--format", "hf", "--out", out, "--buffer_bytes", "100B")
        self.assertEqual(r.returncode, 1)
        self.assertIn("raise --buffer_bytes", r.stderr)
        self.assertEqual(os.listdir(out), [])

    def test_export_of_a_damaged_checkpoint_fails_and_leaves_no_files(self):
        # Flip the first byte of a stored chunk of model.embed.weight: the
        # daemon verifies every block before it delivers, so the export
        # fails instead of writing a plausible file.
        directory = os.path.join(self.daemon.dir, "root", "hf", "step-12")
        target = None
        for name in sorted(os.listdir(directory)):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            if "model.embed.weight" in header:
                target = path, 8 + n + header["model.embed.weight"]["data_offsets"][0]
                break
        self.assertIsNotNone(target)
        path, at = target
        with open(path, "r+b") as f:
            f.seek(at)
            original = f.read(1)
            f.seek(at)
            f.write(bytes([original[0] ^ 0xFF]))
        try:
            out = os.path.join(tempfile.mkdtemp(prefix="ckptd-hf-damaged-"), "export")
            r = self.ctl("export", "hf", "--format", "hf", "--out", out)
            self.assertEqual(r.returncode, 1)
            self.assertIn("checksum", r.stderr)
            self.assertEqual(os.listdir(out), [])
        finally:
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(original)

    def test_export_of_an_unknown_prefix_or_format_is_a_clear_error(self):
        out = os.path.join(tempfile.mkdtemp(prefix="ckptd-hf-none-"), "export")
        r = self.ctl("export", "hf", "--format", "hf", "--out", out, "--prefix", "decoder.")
        self.assertEqual(r.returncode, 1)
        self.assertIn("starting with 'decoder.'", r.stderr)
        r = self.ctl("export", "hf", "--format", "gguf", "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("the one format is hf", r.stderr)


if __name__ == "__main__":
    unittest.main()
