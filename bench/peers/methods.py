"""The checkpointing methods, as one trainer rank calls them.

Each method's `save(state, rep)` returns the three times the benchmark
reports, in seconds from the moment the call started:
- call: the save call returned (what the training loop blocks on);
- staged: the trainer may mutate the saved tensors again;
- durable: the checkpoint is on storage (committed, for ckptd and DCP).
`restore(state)` loads the newest checkpoint into `state` in place.

Where a peer's own meaning of "durable" differs, its docstring says so.
Paths: every method writes under `dir` (one directory per method), one
checkpoint per rep.
"""

import os
import time

import torch

import states as states_mod


class Method:
    writes_from_child_process = False  # the rank samples its children's RSS

    def __init__(self, dir, rank, world, opts):
        self.dir, self.rank, self.world, self.opts = dir, rank, world, opts

    def ckpt_path(self, rep):
        return os.path.join(self.dir, f"ckpt-{rep:03d}")

    def close(self):
        pass


class Ckptd(Method):
    """ckptd.torch.async_save through the node's daemon (started by the
    driver); durable = upload_completion (COMMITTED: every rank's file and
    the node manifest fsynced, COMMIT and LATEST written)."""

    def __init__(self, *a):
        super().__init__(*a)
        import ckptd.torch as ckpt
        self.ckpt = ckpt
        self.socket = self.opts["socket"]
        self.job = self.opts.get("job", "bench")

    def save(self, state, rep):
        t0 = time.perf_counter()
        r = self.ckpt.async_save(state, checkpoint_id=f"ckpt-{rep:03d}", job=self.job,
                                 socket=self.socket)
        t1 = time.perf_counter()
        r.staging_completion.result()
        t2 = time.perf_counter()
        r.upload_completion.result()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t0, t3 - t0

    def restore(self, state):
        self.ckpt.load(state, checkpoint_id="latest", job=self.job, socket=self.socket)

    def restore_source(self, state):
        """Where the daemon serves the newest checkpoint's tensors from
        ("memory": the tier, "storage", "mixed"). ckptd.torch.load does not
        say, so this loads one of this rank's tensors again through the
        low-level client, untimed. (A load of byte items only says
        "storage": they live in the manifest.)"""
        import ckptd
        from ckptd.flatten import flatten
        leaves, _ = flatten(state)
        for fqn, t in sorted(leaves.items()):
            local = t.to_local() if hasattr(t, "to_local") else t
            if isinstance(local, torch.Tensor) and local.numel() > 0:
                client = ckptd.Client(self.job, self.rank, self.world, socket=self.socket)
                return client.load("latest", {fqn: t})["source"]
        return "no tensor"


class DcpSave(Method):
    """torch.distributed.checkpoint.save (FileSystemWriter, sync_files=True:
    each file fsynced before .metadata is written)."""

    def save(self, state, rep):
        import torch.distributed.checkpoint as dcp
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=self.ckpt_path(rep))
        t = time.perf_counter() - t0
        return t, t, t

    def restore(self, state):
        import torch.distributed.checkpoint as dcp
        dcp.load(state, checkpoint_id=self.last)

    @property
    def last(self):
        return self.ckpt_path(self.opts["last_rep"])


class DcpAsync(DcpSave):
    """torch.distributed.checkpoint.async_save.

    executor: "thread" or "process" (AsyncCheckpointerType);
    stager: "default" (what async_save builds itself: a blocking copy of the
    state in the call, StagingOptions all False), or "shm" (a DefaultStager
    kept across saves with StagingOptions(use_pinned_memory=False,
    use_shared_memory=True, use_async_staging=True, use_non_blocking_copy=
    False): the copy runs on a background thread into shared memory, which
    the process executor hands to its writer without another copy).
    Pinned staging (use_pinned_memory / use_non_blocking_copy) needs an
    accelerator: on CPU torch ignores the first (with a warning) and
    refuses the second; the driver records that probe."""

    def __init__(self, *a):
        super().__init__(*a)
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        self.kind = (AsyncCheckpointerType.PROCESS if self.opts["executor"] == "process"
                     else AsyncCheckpointerType.THREAD)
        self.writes_from_child_process = self.opts["executor"] == "process"
        self.stager = None
        if self.opts.get("stager") == "shm":
            self.stager = DefaultStager(StagingOptions(
                use_pinned_memory=False, use_shared_memory=True,
                use_async_staging=True, use_non_blocking_copy=False))

    def save(self, state, rep):
        import torch.distributed.checkpoint as dcp
        t0 = time.perf_counter()
        r = dcp.async_save(state, checkpoint_id=self.ckpt_path(rep),
                           async_checkpointer_type=self.kind, async_stager=self.stager)
        t1 = time.perf_counter()
        if hasattr(r, "staging_completion"):  # an AsyncSaveResponse
            r.staging_completion.result()
            t2 = time.perf_counter()
            r.upload_completion.result()
        else:  # a Future: the call staged already
            t2 = t1
            r.result()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t0, t3 - t0

    def close(self):
        if self.stager is not None:
            self.stager.close()


def _fsync_rank_files(args, rank):
    """torch_checkpointing pre-finalize callback (runs in its writer process,
    before the rename that publishes the checkpoint): fsyncs this rank's
    files (the default layout names them <item>_<rank>.pt) and the
    directory, so that its "durable" means what the others' does."""
    for name in os.listdir(args.path):
        if name.endswith(f"_{rank}.pt"):
            fd = os.open(os.path.join(args.path, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(args.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TorchCheckpointing(Method):
    """torch_checkpointing's CheckpointManager, async, in the CPU
    configuration its troubleshooting guide gives (use_pinned_memory=False,
    use_non_blocking_copy=False; the rest default: shared-memory staging on
    a background thread, a background writer process per rank).

    Two changes from its defaults, both needed for a working, comparable
    run here: (1) its O_DIRECT writer (0.1.1) writes torch.save's unaligned
    records straight to an O_DIRECT file, which ext4 refuses (EINVAL), so
    it runs with LocalFileSystemStorageConfig(use_direct_io=False), the
    guide's setting for file systems without direct I/O; (2) it never
    fsyncs, so a pre-finalize callback fsyncs each rank's files before the
    checkpoint is published (otherwise "durable" would be "in the page
    cache"). staged = `with manager.lock(): pass` returns (the guide's way
    to wait before optimizer.step()); durable = the write future."""

    writes_from_child_process = True

    def __init__(self, *a):
        super().__init__(*a)
        import functools
        from torch_checkpointing import CheckpointManager
        from torch_checkpointing.checkpoint_process import CheckpointProcessConfig
        from torch_checkpointing.config import AsyncCheckpointSaverConfig
        from torch_checkpointing.staging import CheckpointStagerConfig
        from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig
        self.manager = CheckpointManager(CheckpointManager.Config(
            save=AsyncCheckpointSaverConfig(
                staging_config=CheckpointStagerConfig(use_pinned_memory=False,
                                                      use_non_blocking_copy=False),
                # The default 30 s is short for 4 writer processes importing
                # torch on 2 loaded cores; it is not part of what is timed.
                process_config=CheckpointProcessConfig(subprocess_init_timeout_secs=300)),
            storage_config=LocalFileSystemStorageConfig(use_direct_io=self.opts.get(
                "direct_io", False)),
            pre_finalize_callback=functools.partial(_fsync_rank_files, rank=self.rank)))

    def save(self, state, rep):
        t0 = time.perf_counter()
        write = self.manager.save(self.ckpt_path(rep), state)
        t1 = time.perf_counter()
        with self.manager.lock():
            pass
        t2 = time.perf_counter()
        write.result()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t0, t3 - t0

    def restore(self, state):
        self.manager.load(self.ckpt_path(self.opts["last_rep"]), into=state)

    def close(self):
        self.manager.close()


class TorchSave(Method):
    """torch.save of this rank's local tensors (a flat {fqn: tensor} dict)
    to its own file, then fsync; restore = torch.load + copy into the
    state's tensors (the others restore in place)."""

    def _path(self, rep):
        return os.path.join(self.ckpt_path(rep), f"rank-{self.rank:05d}.pt")

    def save(self, state, rep):
        tensors = states_mod.local_tensors(state)
        os.makedirs(self.ckpt_path(rep), exist_ok=True)
        t0 = time.perf_counter()
        with open(self._path(rep), "wb") as f:
            torch.save({str(i): t for i, t in enumerate(tensors)}, f)
            f.flush()
            os.fsync(f.fileno())
        t = time.perf_counter() - t0
        return t, t, t

    def restore(self, state):
        loaded = torch.load(self._path(self.opts["last_rep"]), weights_only=True)
        for i, t in enumerate(states_mod.local_tensors(state)):
            t.copy_(loaded[str(i)])


METHODS = {
    "ckptd": (Ckptd, {}),
    "ckptd-tier": (Ckptd, {}),
    "ckptd-capped": (Ckptd, {}),
    "dcp-save": (DcpSave, {}),
    "dcp-async-thread": (DcpAsync, {"executor": "thread", "stager": "default"}),
    "dcp-async-process": (DcpAsync, {"executor": "process", "stager": "default"}),
    "dcp-async-thread-shm": (DcpAsync, {"executor": "thread", "stager": "shm"}),
    "dcp-async-process-shm": (DcpAsync, {"executor": "process", "stager": "shm"}),
    "torch-checkpointing": (TorchCheckpointing, {}),
    "torch-save": (TorchSave, {}),
}


def make(name, dir, rank, world, opts):
    cls, fixed = METHODS[name]
    return cls(dir, rank, world, dict(opts, **fixed))
