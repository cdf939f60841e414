"""The state dicts every method saves: built the same way in every rank
process, from (layout, total bytes, world size), so that each method sees
the same tensors.

Layouts:
- "small": ~1,000 float32 tensors per rank (many small tensors);
- "large": 8 float32 tensors per rank (a few large ones);
  both DTensors sharded along dim 0 over the world (as FSDP2 holds them),
  so that no tensor is replicated state and every rank writes its own bytes;
- "plain": ~1,000 plain float32 CPU tensors per rank under fqns of their
  own rank (`rank{r}.layers.{i}.weight`): a state of plain tensors that no
  two ranks share, so every rank's leaves differ from its peers' (issue 31,
  item 5: 4 ranks x 1,000 x 64 KiB is `--sizes 256M`);
- "fsdp": an MLP (Linear d->4d->d blocks) wrapped with FSDP2's fully_shard
  on a CPU mesh, AdamW stepped once, then get_state_dict(model, optimizer):
  parameters, exp_avg and exp_avg_sq as DTensors, the step scalars and
  param_groups as every rank's replicated values.

`fill=False` gives the restore template: same structure, zeros (fsdp: a
model initialized from another seed), so a restore that does nothing fails
the fingerprint check.
"""

import math

import torch

SMALL_TENSORS_PER_RANK = 1000
LARGE_TENSORS_PER_RANK = 8
COLS = 256  # float32 columns of the "small" and "large" tensors


def _sharded(local, mesh, world):
    from torch.distributed.tensor import DTensor, Shard
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                              shape=(local.shape[0] * world, *local.shape[1:]),
                              stride=local.stride())


def _flat_state(count, total_bytes, rank, world, fill, seed, plain=False):
    mesh = None
    if not plain:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
    per_rank = total_bytes // world
    rows = max(1, per_rank // (count * COLS * 4))
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    model = {}
    for i in range(count):
        local = torch.empty(rows, COLS, dtype=torch.float32)
        if fill:
            local.uniform_(generator=g)
        else:
            local.zero_()
        if plain:
            model[f"rank{rank}.layers.{i:04d}.weight"] = local
        else:
            model[f"layers.{i:04d}.weight"] = _sharded(local, mesh, world)
    return {"model": model}


class Mlp(torch.nn.Module):
    def __init__(self, d, layers):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                torch.nn.Linear(4 * d, d)) for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def fsdp_shape(total_bytes):
    """(d, layers) of an MLP whose parameters + AdamW's two moments take
    about total_bytes in float32."""
    d = 1024 if total_bytes >= (256 << 20) else 256
    per_layer = 8 * d * d + 5 * d  # two Linears with biases
    return d, max(1, round(total_bytes / (12 * per_layer)))


def _fsdp_state(total_bytes, rank, world, fill, seed):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    d, layers = fsdp_shape(total_bytes)
    torch.manual_seed(seed if fill else seed + 7919)
    model = Mlp(d, layers)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, d)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if not fill:
        # A trainer that restarts has its own values; make them differ.
        for t in _local_tensors({"m": model_sd, "o": optim_sd}):
            t.zero_()
    # Keep the modules alive: the state dict's DTensors are their memory.
    return {"model": model_sd, "optim": optim_sd}, (model, optimizer)


def build(layout, total_bytes, rank, world, *, fill=True, seed=1):
    """(state dict, objects to keep alive)."""
    if layout == "small":
        return _flat_state(SMALL_TENSORS_PER_RANK, total_bytes, rank, world, fill, seed), None
    if layout == "plain":
        return _flat_state(SMALL_TENSORS_PER_RANK, total_bytes, rank, world, fill, seed,
                           plain=True), None
    if layout == "large":
        return _flat_state(LARGE_TENSORS_PER_RANK, total_bytes, rank, world, fill, seed), None
    if layout == "fsdp":
        return _fsdp_state(total_bytes, rank, world, fill, seed)
    raise ValueError(f"unknown layout {layout!r}")


def _local_tensors(obj):
    from torch.distributed.tensor import DTensor
    if isinstance(obj, DTensor):
        yield obj.to_local()
    elif isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _local_tensors(obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _local_tensors(v)


def local_tensors(state):
    """Every tensor this rank holds (DTensors' local shards), in a fixed order."""
    return list(_local_tensors(state))


def local_bytes(state):
    return sum(t.numel() * t.element_size() for t in local_tensors(state))


def fingerprint(state):
    """A cheap checksum of this rank's tensors: a strided sample of every
    tensor, summed in float64 (a restore that misses or misplaces a tensor
    changes it)."""
    total = 0.0
    for i, t in enumerate(local_tensors(state)):
        flat = t.reshape(-1)
        if flat.numel() == 0:
            continue
        step = max(1, flat.numel() // 64)
        total += float(flat[::step].double().sum()) * (1 + (i % 7))
    return total if math.isfinite(total) else str(total)
