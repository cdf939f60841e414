"""Train a small transformer with FSDP2 (or HSDP) on CPU, checkpointing it
through ckptd every step the way torch.distributed.checkpoint (DCP) users do,
and resume from the latest checkpoint on any number of processes.

How to run, from the repository root, with torch in .venv and ckptd built
against it (scripts/test.sh installs torch; scripts/build.sh builds):

    mkdir -p /tmp/ckptd-example
    build/daemon/ckptd --socket /tmp/ckptd-example/ckptd.sock \
        --root /tmp/ckptd-example/root --pool_bytes $((64 << 20)) \
        >/tmp/ckptd-example/ckptd.log 2>&1 &
    # 4 processes, HSDP (2 replicas x 2 shards), a checkpoint every step:
    PYTHONPATH=build/python .venv/bin/python examples/train_fsdp.py \
        --socket /tmp/ckptd-example/ckptd.sock --nproc 4 --replicas 2 --steps 4
    # Again on 2 processes (FSDP over 2): resumes from step 4, trains to 8:
    PYTHONPATH=build/python .venv/bin/python examples/train_fsdp.py \
        --socket /tmp/ckptd-example/ckptd.sock --nproc 2 --steps 8

The script starts its ranks itself (torch.multiprocessing, gloo, a file
rendezvous). Under torchrun each process is one rank instead (env://):

    PYTHONPATH=build/python .venv/bin/torchrun --standalone --nproc-per-node 4 \
        examples/train_fsdp.py --socket /tmp/ckptd-example/ckptd.sock \
        --replicas 2 --steps 4

What it shows: `ckptd.torch.async_save` takes what DCP's async_save takes
(the nested dicts of `get_state_dict(model, optimizer)`: FSDP2/HSDP DTensors,
AdamW's state, Python values, an RNG state) and returns once the daemon has
accepted the save; the loop waits for STAGED only before the next
`optimizer.step()`, the one call that changes the saved tensors, and
storage runs behind training. The call time printed includes the save's one
small collective, which waits for the slowest rank: with more processes
than cores, it mostly measures the scheduler. `ckptd.torch.load` fills a
fresh run's state dict in place from whatever mesh saved it, and
`set_state_dict` hands it to the model and optimizer.
tests/python/test_training_run.py trains this model beside stock DCP and
checks that a resumed run matches an uninterrupted one;
tests/python/test_example_train_fsdp.py runs the README's copy of the
commands above.
"""

import argparse
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist

VOCAB = 64
WIDTH = 32
HEADS = 4
LAYERS = 2
SEQ = 8
BATCH = 8  # sequences per step, over all data-parallel ranks


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self):
        super().__init__()
        self.attn_norm = torch.nn.LayerNorm(WIDTH)
        # No biases here: a key bias gets no gradient (softmax ignores a
        # shift shared by every key), so Adam would turn the rounding noise
        # of its gradient into full-size updates.
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, bias=False, batch_first=True)
        self.mlp_norm = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, causal):
        y = self.attn_norm(x)
        x = x + self.attn(y, y, y, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(torch.nn.Module):
    """A next-token model of about 30k parameters (about 360 KB of state
    with AdamW's moments)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        # One element: sharded on dim 0 by FSDP, it leaves every rank of a
        # shard group but the first an empty shard, which checkpoints must
        # save and restore like any other.
        self.logit_scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, tokens):
        n = tokens.shape[1]
        causal = torch.full((n, n), float("-inf")).triu(1)
        x = self.embed(tokens) + self.position[:n]
        for layer in self.layers:
            x = layer(x, causal)
        return self.head(self.norm(x)) * self.logit_scale


def next_batch(rng: torch.Generator, dp_rank: int, dp_world: int):
    """This rank's share of the next global batch: arithmetic sequences mod
    VOCAB (a pattern the model learns in a few steps). Every rank draws the
    whole batch from `rng`, so every rank's rng stays the same (replicated
    state, saved once) and the global batch does not depend on the world."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=rng)
    stride = torch.randint(1, 4, (BATCH, 1), generator=rng)
    tokens = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    rows = BATCH // dp_world
    mine = tokens[dp_rank * rows:(dp_rank + 1) * rows]
    return mine[:, :-1], mine[:, 1:]


def forward_backward(model, inputs, targets) -> torch.Tensor:
    """Backpropagates this rank's loss (data-parallel wrappers average the
    gradients); returns the loss over the global batch, for the log."""
    loss = torch.nn.functional.cross_entropy(model(inputs).reshape(-1, VOCAB),
                                             targets.reshape(-1))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def device_mesh(world: int, replicas: int):
    """HSDP over (replicas x world/replicas) ranks; FSDP when replicas is 1."""
    from torch.distributed.device_mesh import init_device_mesh
    if world % replicas:
        raise SystemExit(f"--replicas {replicas} does not divide {world} processes")
    if replicas == 1:
        return init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    return init_device_mesh("cpu", (replicas, world // replicas),
                            mesh_dim_names=("replicate", "shard"))


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """FSDP2: each block its own unit, the rest in the root's. A 2-D mesh
    makes it HSDP (replicated over the first dimension, sharded over the
    second)."""
    from torch.distributed.fsdp import fully_shard
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def training_state(model, optimizer, rng: torch.Generator, step: int) -> dict:
    """What a checkpoint holds, as DCP users build it: get_state_dict's
    nested dicts (DTensors under FSDP2/HSDP), the step, the data RNG."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "step": step, "data_rng": rng.get_state()}


def train(rank: int, world: int, args, init_method: str) -> None:
    import ckptd.torch as ckpt
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if BATCH % world:
        raise SystemExit(f"{world} processes do not divide the batch of {BATCH} sequences")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        torch.manual_seed(0)  # the same initial model on every rank
        model = shard(TinyTransformer(), device_mesh(world, args.replicas))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        rng = torch.Generator().manual_seed(0)

        # Resume: fill the state dict of the fresh model and optimizer in
        # place from the latest committed checkpoint, whichever mesh saved it.
        resumed = training_state(model, optimizer, rng, 0)
        try:
            name = ckpt.load(resumed, checkpoint_id="latest", job=args.job, socket=args.socket)
        except ckpt.CheckpointNotFound:
            name = None
        if name is not None:
            set_state_dict(model, optimizer, model_state_dict=resumed["model"],
                           optim_state_dict=resumed["optim"])
            rng.set_state(resumed["data_rng"])
        first = resumed["step"] + 1
        if rank == 0:
            print(f"{'resumed from ' + name if name else 'no checkpoint yet'}: job "
                  f"{args.job!r}, {world} ranks, training steps {first}..{args.steps}",
                  flush=True)

        response = None
        for step in range(first, args.steps + 1):
            inputs, targets = next_batch(rng, rank, world)
            loss = forward_backward(model, inputs, targets)
            if response is not None:
                # The daemon has copied the previous checkpoint's bytes
                # (long done, normally); only now may the step change them.
                response.staging_completion.result()
            optimizer.step()
            optimizer.zero_grad()
            to_save = training_state(model, optimizer, rng, step)
            started = time.perf_counter()
            response = ckpt.async_save(to_save, checkpoint_id=f"step-{step:08d}",
                                       job=args.job, socket=args.socket)
            call_ms = (time.perf_counter() - started) * 1e3
            if rank == 0:
                print(f"step {step}  loss {loss.item():.4f}  async_save returned in "
                      f"{call_ms:.1f} ms", flush=True)
        if response is not None:
            response.upload_completion.result()  # committed: a later run resumes from it
            if rank == 0:
                print(f"{response.checkpoint_id} committed", flush=True)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, args, store: str) -> None:
    train(rank, world, args, f"file://{store}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=None,
                        help="the ckptd daemon's socket (default: the daemon's default)")
    parser.add_argument("--job", default="tiny-transformer")
    parser.add_argument("--nproc", type=int, default=2,
                        help="processes to start (ignored under torchrun)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="HSDP replicas; 1: FSDP over every rank")
    parser.add_argument("--steps", type=int, default=8, help="train up to this step")
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    if "RANK" in os.environ:  # torchrun started this rank
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return
    rendezvous = tempfile.mkdtemp(prefix="train-fsdp-")
    try:
        torch.multiprocessing.spawn(_spawned, nprocs=args.nproc,
                                    args=(args.nproc, args, os.path.join(rendezvous, "store")))
    finally:
        shutil.rmtree(rendezvous)


if __name__ == "__main__":
    main()
