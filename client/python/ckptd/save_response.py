"""AsyncSaveResponse: the two futures of one save, as DCP's async_save has.

- staging_completion resolves once the daemon has copied every byte of this
  rank out (STAGED): from then on the caller may mutate or free the saved
  tensors. Until then the response itself holds a reference to every tensor
  (and contiguous copy) the daemon reads, so their storage stays alive
  whatever the caller does with its state dict.
- upload_completion resolves once the checkpoint is COMMITTED (every rank's
  part durable, COMMIT written); it fails if the save fails, with the
  daemon's reason.

One watcher thread per save waits on the daemon (the binding releases the
GIL while it waits) and resolves the futures; a failure before STAGED fails
both.

Thread-safety: the futures are concurrent.futures.Future (thread-safe); the
watcher thread alone touches the save handle after construction.
"""

import concurrent.futures
import threading
from typing import Any, List, Optional


class AsyncSaveResponse:
    """Returned by ckptd.torch.async_save; fields as DCP's AsyncSaveResponse."""

    def __init__(self, checkpoint_id: str):
        self.checkpoint_id = checkpoint_id
        self.staging_completion: concurrent.futures.Future = concurrent.futures.Future()
        self.upload_completion: concurrent.futures.Future = concurrent.futures.Future()
        self._keep_alive: Optional[List[Any]] = None
        self._handle = None

    @classmethod
    def failed(cls, checkpoint_id: str, error: BaseException) -> "AsyncSaveResponse":
        response = cls(checkpoint_id)
        response.staging_completion.set_exception(error)
        response.upload_completion.set_exception(error)
        return response

    def _watch(self, handle, keep_alive: List[Any]) -> None:
        """Starts the watcher of `handle` (a ckptd._ckpt.SaveHandle)."""
        self._handle = handle
        self._keep_alive = keep_alive
        threading.Thread(target=self._run, name=f"ckptd-save-{self.checkpoint_id}",
                         daemon=True).start()

    def _run(self) -> None:
        try:
            self._handle.wait_staged()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._keep_alive = None
            self.staging_completion.set_exception(e)
            self.upload_completion.set_exception(e)
            return
        self._keep_alive = None  # the daemon has its copy
        self.staging_completion.set_result(None)
        try:
            self._handle.wait_committed()
        except BaseException as e:  # noqa: BLE001
            self.upload_completion.set_exception(e)
            return
        self.upload_completion.set_result(None)

    def progress(self) -> dict:
        """The daemon's view of this rank's part ({} for a save refused
        before it reached the daemon)."""
        return self._handle.progress() if self._handle is not None else {}

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
