"""A torchtitan checkpoint manager that saves and loads through ckptd.

torchtitan (>= 0.3) builds whichever checkpoint manager's `Config` its
trainer is given (`Trainer.Config.checkpoint: BaseCheckpointManager.Config`),
so a torchtitan user switches to ckptd by configuration:

    from ckptd.torchtitan import CkptdCheckpointManager

    checkpoint=CkptdCheckpointManager.Config(
        enable=True, folder="checkpoint", interval=500, async_mode="async")

This module imports torchtitan; the rest of ckptd does not, and nothing
imports this module unless the caller does (ckptd does not require
torchtitan).

The policy is torchtitan's DCP manager's (components/checkpointer/dcp.py),
rule for rule: a save at every `interval`-th step, at step 1 with
`enable_first_step_checkpoint`, and at the last step (model only, in
`export_dtype`, with `last_save_model_only`); nothing with `load_only`; the
same flattened state (the model's fqns at the top level beside
"optimizer", "lr_scheduler", "dataloader" and the caller's states) under
the same names (`step-N`). What changes is where it goes:

- Checkpoints are stored by the node's ckptd daemon (`socket`, else
  $CKPTD_SOCKET, else ckptd's default) under a job: `job`, else the job
  ckptd.torch derives from the checkpoint folder (`<dump_folder>/<folder>`,
  made absolute and encoded reversibly, checkpoint_ids.py), the same job a
  DCP-style `checkpoint_id="<folder>/step-N"` maps to. The folder names
  the checkpoints; the files live under the daemon's root.
- `load(step=-1)` resumes from the job's latest committed checkpoint
  (ckptd.torch.latest_checkpoint): a save that did not commit (the job was
  killed during it) is never picked. `initial_load_path` (used only while
  the job has no checkpoint, as in DCP's manager) is a stock DCP or Hugging
  Face directory, read with stock torch.distributed.checkpoint.
- `async_mode` "async" and "async_with_pinned_mem" are both
  ckptd.torch.async_save: the call returns at once, `staging_future` is its
  staging_completion (the trainer's maybe_wait_for_staging() before the
  optimizer step), `save_future` its upload_completion (the commit). ckptd
  stages into the daemon's pinned pool, so there is no trainer-side pinned
  copy to choose.
- `keep_latest_k` is not applied by this client: ckptd.torch cannot delete
  a job's checkpoints. The daemon's retention (`keep_last` in ckptd.conf,
  or `--keep_last N`) keeps the newest N committed checkpoints of every
  job, after each commit, never the latest and never one being loaded. Set
  it on the daemon; the manager logs, once, that keep_latest_k is left to
  it (docs/DCP.md, "torchtitan").
- `last_save_in_hf` is refused: the daemon writes ckptd's format; `ckptctl
  export --format hf` writes Hugging Face safetensors from a committed
  checkpoint.

Thread-safety: as torchtitan's managers, one training thread.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Optional, TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp

from torchtitan.components.checkpointer.base import (
    BaseCheckpointManager, DATALOADER, LR_SCHEDULER, MODEL, ModelWrapper, OPTIMIZER)
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools import filesystem

import ckptd.torch as ckpt
from ckptd import checkpoint_ids

if TYPE_CHECKING:
    import torch.nn as nn

logger = logging.getLogger("ckptd.torchtitan")

__all__ = ["CkptdCheckpointManager"]

_STEP = re.compile(r"step-(\d+)")


def default_job(folder: str) -> str:
    """The ckptd job of a checkpoint folder: the job ckptd.torch gives a
    DCP-style checkpoint_id "<folder>/step-N" (checkpoint_ids.resolve)."""
    return checkpoint_ids.resolve(os.path.join(folder, "step-0"), None)[0]


class CkptdCheckpointManager(BaseCheckpointManager):
    """torchtitan's checkpoint manager over ckptd.torch (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        job: Optional[str] = None
        """ckptd job the checkpoints are saved under. None: derived from the
        checkpoint folder (<dump_folder>/<folder>, made absolute) as
        ckptd.torch maps a DCP path, so every rank and every restart of the
        same run names the same job."""

        socket: Optional[str] = None
        """The node's ckptd socket. None: $CKPTD_SOCKET, else (in a Slurm
        job) the node's per-job daemon, else ckptd's default."""

        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
        """As DCP's manager: "disabled" saves return once committed; "async"
        and "async_with_pinned_mem" (the same here: ckptd stages in the
        daemon) return at once, staging awaited before the next optimizer
        step, the commit before the next save."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            mode = self.async_mode.lower()
            if mode not in ("disabled", "async", "async_with_pinned_mem"):
                raise ValueError(f"Invalid async_mode: {mode}")
            self.async_mode = mode
            if self.last_save_in_hf:
                raise ValueError(
                    "last_save_in_hf is not supported by CkptdCheckpointManager: the "
                    "daemon stores ckptd's format; write Hugging Face safetensors from "
                    "the committed checkpoint with `ckptctl export --format hf`")
            if self.job is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}",
                                                         self.job):
                raise ValueError(f"checkpoint.job {self.job!r} must be 1 to 128 "
                                 f"characters of [A-Za-z0-9._-]")

    def __init__(
        self,
        config: Config,
        *,
        dataloader: Any,
        model_parts: list[nn.Module],
        optimizers: Any,
        lr_schedulers: Any,
        states: dict[str, Any],
        sd_adapter: Any,
        base_folder: str = "",
    ) -> None:
        self.enable = config.enable
        if not self.enable:
            return
        self.save_future: Future | None = None
        self.staging_future: Future | None = None

        self.folder = filesystem.join(base_folder, config.folder)
        if config.job is None and filesystem.is_remote(self.folder):
            raise ValueError(
                f"checkpoint.folder {self.folder} is a remote URI: ckptd derives the "
                f"job from a local path only; set checkpoint.job (the daemon's remote "
                f"tier, ckptd --remote, copies committed checkpoints off the node)")
        self.job = config.job if config.job is not None else default_job(self.folder)
        self.socket = config.socket
        self.interval = config.interval

        self.states = states
        self.states.update({
            MODEL: ModelWrapper(model_parts),
            OPTIMIZER: optimizers,
            DATALOADER: dataloader,
            LR_SCHEDULER: lr_schedulers,
        })

        self.load_only = config.load_only
        self.exclude_from_loading = config.exclude_from_loading
        self.initial_load_path = config.initial_load_path
        self.initial_load_model_only = config.initial_load_model_only
        self.initial_load_in_hf = config.initial_load_in_hf
        self.initial_load_in_hf_quantized = config.initial_load_in_hf_quantized
        self.enable_first_step_checkpoint = config.enable_first_step_checkpoint
        self.last_save_model_only = config.last_save_model_only
        self.export_dtype = TORCH_DTYPE_MAP[config.export_dtype]
        self.sd_adapter = sd_adapter
        self.async_mode = config.async_mode

        self.keep_latest_k = config.keep_latest_k
        if self.keep_latest_k > 0 and _rank() == 0:
            logger.warning(
                "checkpoint.keep_latest_k=%d is not applied by CkptdCheckpointManager: "
                "ckptd.torch cannot delete checkpoints. The daemon's retention "
                "(keep_last in ckptd.conf, or ckptd --keep_last N) keeps the newest N "
                "committed checkpoints of every job; set it there (docs/DCP.md, "
                "torchtitan).", self.keep_latest_k)
        logger.info("Checkpointing through ckptd: job %s (folder %s), socket %s",
                    self.job, self.folder, self.socket or "default")

    def __del__(self) -> None:
        # No waiting in a finalizing interpreter: ckptd.torch has released its
        # exchange group at exit; close() is the trainer's to call.
        if sys is None or sys.is_finalizing():
            return
        try:
            self.close()
        except Exception as e:  # a destructor must not raise
            logger.warning("CkptdCheckpointManager.close() from __del__: %s", e)

    # -- the hooks of BaseCheckpointManager ---------------------------------

    def _close(self) -> None:
        # ckptd.torch keeps no per-manager threads; the save in flight is
        # waited for, so that a trainer that closes and exits has committed
        # (or learns that the save failed).
        if self.save_future is not None:
            self._wait_for_saving()
        self.staging_future = None

    @torch.no_grad()
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self._should_save(curr_step, last_step):
            return False
        self.maybe_wait_for_saving()
        name = self._checkpoint_name(curr_step)

        if last_step:
            if self.last_save_model_only:
                states = {
                    k: v.to(self.export_dtype)
                    if isinstance(v, torch.Tensor) and v.is_floating_point()
                    and v.dtype != self.export_dtype else v
                    for k, v in self.states[MODEL].state_dict().items()
                }
                logger.info("Saving a model only checkpoint in %s at last step, step %d.",
                            self.export_dtype, curr_step)
            else:
                logger.info("Saving a full checkpoint at last step, step %d.", curr_step)
                states = self._flattened_model_states_sd()
            ckpt.save(states, checkpoint_id=name, job=self.job, socket=self.socket)
            return True

        states = self._flattened_model_states_sd()
        if self.async_mode == "disabled":
            ckpt.save(states, checkpoint_id=name, job=self.job, socket=self.socket)
        else:
            response = ckpt.async_save(states, checkpoint_id=name, job=self.job,
                                       socket=self.socket)
            self.staging_future = response.staging_completion
            self.save_future = response.upload_completion
        return True

    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        model_only = False
        from_hf = False
        from_quantized = False

        committed = self._committed_steps()
        if step != -1 and not committed:
            raise FileNotFoundError(
                f"--checkpoint.load_step={step} not found because ckptd job {self.job} "
                f"(checkpoint.folder {self.folder}) has no committed checkpoint")
        load_step = -1
        if committed:
            load_step = self._find_load_step(committed) if step == -1 else step

        if load_step == -1:
            model_only = self.initial_load_model_only
            from_hf = self.initial_load_in_hf
            from_quantized = self.initial_load_in_hf_quantized
            if self.initial_load_path:
                checkpoint_id = self.initial_load_path
                if not filesystem.isdir(checkpoint_id):
                    raise ValueError(
                        f"Checkpoint.initial_load_path is invalid: {checkpoint_id}")
            elif from_hf:
                assert self.sd_adapter and self.sd_adapter.hf_assets_path, (
                    "from_hf=True requires sd_adapter and hf_assets_path.")
                checkpoint_id = self.sd_adapter.hf_assets_path
                if not filesystem.isdir(checkpoint_id):
                    raise ValueError(
                        "model.hf_assets_path is being used to load HF weights but the "
                        "path is not valid. Either make sure hf_assets_path is correct "
                        "or provide a valid checkpoint.initial_load_path")
            else:
                logger.info("No checkpoint was provided, this is a fresh start.")
                return False
            # A stock DCP (or Hugging Face) directory: stock DCP reads it.
            logger.info("Loading the initial checkpoint from %s.", checkpoint_id)
            states = self._states_to_load(model_only)
            if from_hf:
                hf_state_dict = self.sd_adapter.to_hf(states)
                reader = self.sd_adapter.get_hf_storage_reader(checkpoint_id,
                                                               from_quantized)
                dcp.load(hf_state_dict, storage_reader=reader)
                self.states[MODEL].load_state_dict(self.sd_adapter.from_hf(hf_state_dict))
            else:
                dcp.load(states, checkpoint_id=checkpoint_id)
                self.states[MODEL].load_state_dict(states)
            return True

        # Resume (the fault-tolerance branch): the job has committed
        # checkpoints, and the initial_* options are ignored, as in DCP's.
        if load_step not in committed:
            raise FileNotFoundError(
                f"--checkpoint.load_step={load_step} not found: ckptd job {self.job} "
                f"(checkpoint.folder {self.folder}) has committed "
                f"{sorted(committed) or 'no steps'}")
        model_only = load_step == 0
        name = committed[load_step]
        logger.info("Loading checkpoint %s of ckptd job %s.", name, self.job)
        states = self._states_to_load(model_only)
        ckpt.load(states, checkpoint_id=name, job=self.job, socket=self.socket)
        # The model's tensors are flattened into the top level (as DCP's
        # manager does), so the model is given them by hand.
        self.states[MODEL].load_state_dict(states)
        return True

    def _maybe_wait_for_staging(self) -> None:
        if self.staging_future is None:
            return
        self.staging_future.result()
        self.staging_future = None

    def _wait_for_saving(self) -> None:
        assert self.save_future is not None
        future, self.save_future = self.save_future, None
        future.result()

    # -- helpers, as dcp.py's -------------------------------------------------

    def _checkpoint_name(self, step: int) -> str:
        return f"step-{step}"

    def _committed_steps(self) -> dict[int, str]:
        """{step: name} of the job's committed step-N checkpoints."""
        steps = {}
        for name in ckpt.list_checkpoints(job=self.job, socket=self.socket):
            m = _STEP.fullmatch(name)
            if m:
                steps[int(m.group(1))] = name
        return steps

    def _find_load_step(self, committed: dict[int, str]) -> int:
        """The step of the job's latest committed checkpoint (by commit, as
        ckptd.torch's checkpoint_id="latest"); the highest step if the
        latest is not a step-N name."""
        latest = ckpt.latest_checkpoint(job=self.job, socket=self.socket)
        m = _STEP.fullmatch(latest or "")
        if m and int(m.group(1)) in committed:
            return int(m.group(1))
        return max(committed) if committed else -1

    def _flattened_model_states_sd(
            self, state_dict: dict[str, Any] | None = None) -> dict[str, Any]:
        states = state_dict if state_dict is not None else self.states
        sd = {k: v for k, v in states.items() if k != MODEL}
        if MODEL in states:
            sd.update(states[MODEL].state_dict())
        return sd

    def _states_to_load(self, model_only: bool) -> dict[str, Any]:
        if model_only:
            return self.states[MODEL].state_dict()
        for exclude_key in self.exclude_from_loading:
            if exclude_key not in self.states:
                raise ValueError(f"{exclude_key} not found in state_dict.")
        states_to_load = {k: v for k, v in self.states.items()
                          if k not in self.exclude_from_loading}
        return self._flattened_model_states_sd(states_to_load)

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self.enable or self.load_only:
            return False
        if curr_step == 1 and self.enable_first_step_checkpoint:
            return True
        if last_step:
            return True
        return curr_step % self.interval == 0


def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
