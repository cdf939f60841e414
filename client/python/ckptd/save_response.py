"""AsyncSaveResponse: the two futures of one save, as DCP's async_save has.

- staging_completion resolves once the daemon has copied every byte of this
  rank out (STAGED): from then on the caller may mutate or free the saved
  tensors. Until then the response itself holds a reference to every tensor
  the daemon reads, so their storage stays alive whatever the caller does
  with its state dict.
- wait_staged_on_stream() is the GPU-side STAGED of a save with GPU
  tensors (ckptd.SaveHandle's): it makes the stream the save was called on
  (or `stream`) wait for the daemon's copies of this rank's GPU tensors, so
  the optimizer step queued next runs after them while the CPU goes on (at
  once when the save's CPU tensors, if any, went through the
  checkpointer's copy buffers, as small ones such as AdamW's `step` do:
  those are snapshot regions, rewritten only after STAGED; with a CPU
  tensor read in place, once the daemon has queued its copies and read
  it). In the first case the CPU does not even wait for the submit thread
  to hand the save over: the stream waits for a relay record the save
  call reserved (ckptd._ckpt.StagedRelay, libckpt's client/staged_relay.h),
  which the submit thread passes the daemon's staged record on to once
  the save is submitted, on a relay stream of its own; in the second it
  waits for the hand-over first. Call it before queuing any write to a
  saved tensor: the optimizer step, and a forward pass that updates saved buffers
  (BatchNorm's running statistics). staging_completion still resolves
  only once every byte is copied, and the response holds the tensors
  until then.
- upload_completion resolves once the checkpoint is COMMITTED (every rank's
  part durable, COMMIT written); it fails if the save fails, with the
  daemon's reason (ckptd.errors.SaveFailed), or with DaemonUnavailable if
  the daemon went away before the save finished (libckpt's progress stream
  ends when the daemon's process does).
- remote_completion (made when first asked for) resolves once the
  checkpoint is also committed in the daemon's remote tier (--remote): the
  save's remote phase, the last message of its progress stream
  (PHASE_REMOTE_COMMITTED or PHASE_REMOTE_FAILED after COMMITTED).

A SaveWatcher (one per Checkpointer, two threads started on its first save)
waits on the daemon for the responses and resolves their futures: a thread
per save would cost the save call a thread start (~1 ms on a loaded
machine). Staging waits run one at a time, in order: a checkpointer submits
a save only once the previous one is STAGED. Commit waits run in order on
the second thread, so a commit never delays a later save's staging. Both
threads wait in the binding without the GIL. The staging thread also makes
the next save's response once a save is staged (`take`): two
concurrent.futures.Future cost the save call ~30 us on a machine whose
caches the daemon and the training step have just walked through.

Thread-safety: the futures are concurrent.futures.Future (thread-safe); a
watcher thread alone touches a save handle after submission.
"""

import concurrent.futures
import queue
import threading
from typing import Any, Optional

from ckptd import errors


class AsyncSaveResponse:
    """Returned by ckptd.torch.async_save; fields as DCP's AsyncSaveResponse."""

    __slots__ = ("checkpoint_id", "staging_completion", "upload_completion",
                 "_keep_alive", "_handle", "_socket", "_lock", "_cancel_requested",
                 "_stream", "_relay", "_handed_over", "_connection", "_remote",
                 "storage_name")

    # How long remote_completion waits for the remote commit after the
    # local one: the daemon's own bound on an upload (30 minutes by
    # default, --remote_upload_timeout_ms) ends it first.
    REMOTE_TIMEOUT_S = 2 * 3600.0

    def __init__(self, checkpoint_id: str):
        self.checkpoint_id = checkpoint_id
        # The name the daemon stores it under: checkpoint_id, or a new
        # generation of it ("NAME~N", generations.py); set once submitted.
        self.storage_name: Optional[str] = None
        self.staging_completion: concurrent.futures.Future = concurrent.futures.Future()
        self.upload_completion: concurrent.futures.Future = concurrent.futures.Future()
        self._keep_alive: Optional[Any] = None
        self._handle = None
        self._socket = None
        # cancel() may come before the submit thread has the save's handle.
        self._lock = threading.Lock()
        self._cancel_requested = False
        self._stream: Optional[int] = None  # the GPU stream of the save call
        # ckptd._ckpt.StagedRelay, for a save whose host tensors are all
        # copies (checkpointer.py): its stream waits before the hand-over.
        self._relay = None
        # Set once the save is submitted (_attach) or has failed (_fail).
        self._handed_over = threading.Event()
        # The binding client the save went through (remote_completion asks
        # its daemon), and the remote future once asked for.
        self._connection = None
        self._remote: Optional[concurrent.futures.Future] = None

    @property
    def remote_completion(self) -> concurrent.futures.Future:
        """Resolves once the checkpoint is committed in the daemon's remote
        tier (ckptd --remote: copied there after the local commit, off the
        trainer's path; docs/OPERATIONS.md) with a dict of the upload
        (state, bytes_total, files_total, seconds). It fails as
        upload_completion does if the save fails, with CkptdError naming
        the node, the object and the server's answer if the upload fails,
        and with CkptdError if the daemon has no remote tier. Made on first
        use (a thread waits for it then): a save that never asks costs
        nothing."""
        with self._lock:
            if self._remote is None:
                self._remote = concurrent.futures.Future()
                threading.Thread(target=self._wait_remote, name="ckptd-remote",
                                 daemon=True).start()
            return self._remote

    def _wait_remote(self) -> None:
        try:
            self.upload_completion.result()  # committed locally first
            if self._connection is None or self._handle is None:
                raise errors.CkptdError("this save never reached a daemon")
            # The remote phase as the save's progress stream reports it.
            result = self._handle.wait_remote_committed(self.REMOTE_TIMEOUT_S)
            if result is None:
                # Committed with no remote phase: a daemon without a remote
                # tier (this says so), or one older than the remote phase
                # (this follows its upload through its status).
                result = self._connection.wait_remote_committed(
                    self.storage_name or self.checkpoint_id, self.REMOTE_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._remote.set_exception(self._explain(e))
            return
        self._remote.set_result(result)

    def _fail(self, error: BaseException) -> None:
        self._keep_alive = None
        for future in (self.staging_completion, self.upload_completion):
            if not future.done():
                future.set_exception(error)
        self._handed_over.set()

    def wait_staged_on_stream(self, stream: Optional[int] = None) -> None:
        """The GPU-side STAGED (the module comment). For a save of CUDA
        tensors and copied CPU tensors and values only, the CPU waits for
        nothing, and a failure shows in upload_completion (raised here if
        it is known already); with a CPU
        tensor read in place it waits until the daemon queued its copies,
        and raises the save's error if it failed before."""
        if self._relay is not None:
            # A failure already known is raised (as without the relay); one
            # still to come shows in upload_completion.
            failed = self.staging_completion.done() and self.staging_completion.exception()
            if failed:
                raise failed
            try:
                self._relay.wait_on_stream(self._stream if stream is None else stream)
            except errors.CkptdError as e:
                raise self._explain(e) from None
            return
        self._handed_over.wait()
        handle = self._handle
        if handle is None or self._stream is None:
            # Failed before submission (its error first), or no GPU tensors.
            if self.staging_completion.done() and self.staging_completion.exception():
                raise self.staging_completion.exception()
            if self._stream is None:
                raise ValueError("this save has no GPU tensors: wait for staging_completion")
            raise AssertionError("a save neither submitted nor failed")
        try:
            handle.wait_staged_on_stream(self._stream if stream is None else stream)
        except errors.CkptdError as e:
            raise self._explain(e) from None

    def _explain(self, error: BaseException) -> BaseException:
        """A lost daemon, said in the user's terms."""
        if isinstance(error, errors.DaemonUnavailable):
            return errors.DaemonUnavailable(
                f"the ckptd daemon at {self._socket} went away before save "
                f"{self.checkpoint_id!r} finished; this save is lost, the previous "
                f"committed checkpoint is intact, and the next call reconnects "
                f"({error})")
        return error

    def progress(self) -> dict:
        """The daemon's view of this rank's part ({} for a save not yet
        submitted, or refused before it reached the daemon)."""
        handle = self._handle
        return handle.progress() if handle is not None else {}

    def cancel(self) -> None:
        """Cancels the save (every rank's part); one not yet submitted is
        cancelled as soon as it is. The cancel reaches the daemon just after
        this rank's part: where the other ranks' parts are already there and
        the save is small, the daemon may commit it first (milliseconds);
        the futures say which happened."""
        with self._lock:
            self._cancel_requested = True
            handle = self._handle
        if handle is not None:
            handle.cancel()

    def _attach(self, handle) -> None:
        """The submitted save's handle (the submit thread)."""
        with self._lock:
            self._handle = handle
            cancel = self._cancel_requested
        self._handed_over.set()
        if cancel:
            try:
                handle.cancel()
            except errors.CkptdError:
                pass  # the save fails or commits regardless; its futures say which


class SaveWatcher:
    """Resolves the futures of one checkpointer's saves."""

    def __init__(self, name: str):
        self._name = name
        self._staging: "queue.SimpleQueue" = queue.SimpleQueue()
        self._commits: "queue.SimpleQueue" = queue.SimpleQueue()
        self._started = False
        self._spare: Optional[AsyncSaveResponse] = None

    def take(self, checkpoint_id: str) -> AsyncSaveResponse:
        """A fresh response for the next save: the one the staging thread
        made ahead, if it has, else a new one."""
        response, self._spare = self._spare, None
        if response is None:
            return AsyncSaveResponse(checkpoint_id)
        response.checkpoint_id = checkpoint_id
        response.storage_name = None
        return response

    def watch(self, response: AsyncSaveResponse, handle, keep_alive) -> None:
        response._keep_alive = keep_alive
        response._attach(handle)
        if not self._started:
            self._started = True
            for target, q in ((self._stage, self._staging), (self._commit, self._commits)):
                threading.Thread(target=target, args=(q,), name=f"ckptd-{self._name}",
                                 daemon=True).start()
        self._staging.put(response)

    def _stage(self, q) -> None:
        while True:
            r = q.get()
            try:
                r._handle.wait_staged()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                r._fail(r._explain(e))
                continue
            r._keep_alive = None  # the daemon has its copy
            r.staging_completion.set_result(None)
            self._commits.put(r)
            if self._spare is None:
                self._spare = AsyncSaveResponse("")

    def _commit(self, q) -> None:
        while True:
            r = q.get()
            try:
                r._handle.wait_committed()
            except BaseException as e:  # noqa: BLE001
                r.upload_completion.set_exception(r._explain(e))
                continue
            r.upload_completion.set_result(None)
