"""SaveSubmitter: one thread that finishes a checkpointer's saves after the
save call has returned.

The save call does only what must happen at the call (checkpointer.py):
matching the plan, copying the small tensors and pickling the values, so
that the save holds the bytes of that moment. What is left needs nothing
from the caller's state dict but the memory the response keeps alive: the
replica exchange (a collective, which waits for the slowest rank) and the
save RPC (the C++ client's ~0.8 ms call). Done on the caller's thread they
were most of the call; here they overlap the caller's next work, as
torch_checkpointing's staging thread does, and staging_completion, which
the trainer waits on before it mutates the state, still resolves only once
the daemon has copied every byte.

Jobs run one at a time, in submission order, so every rank of a job runs its
collectives in the order its saves were made (the exchange's process group
is the checkpointer's own: no other thread issues collectives on it). A job
reports its failures through its response's futures; whatever it raises
instead goes to its `fail` callback, and the next job runs regardless. The
thread is started on the first job (a thread start costs the call ~1 ms on
a loaded machine) and is a daemon thread: a process that exits before its
save is STAGED loses that save, as it would with the RPC made on the call.

Thread-safety: submit() and wait_idle() from the caller's thread.
"""

import queue
import threading
from typing import Callable, Optional


class SaveSubmitter:
    """Runs the jobs of one checkpointer's saves, in order, on one thread."""

    def __init__(self, name: str):
        self._name = name
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._last_done: Optional[threading.Event] = None

    def submit(self, job: Callable[[], None],
               fail: Callable[[BaseException], None]) -> None:
        done = threading.Event()
        self._last_done = done
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ckptd-submit-{self._name}",
                                            daemon=True)
            self._thread.start()
        self._jobs.put((job, fail, done))

    def wait_idle(self) -> None:
        """Returns once every job submitted so far has run (Ctrl-C ends the
        wait with KeyboardInterrupt)."""
        if self._last_done is not None:
            self._last_done.wait()

    def _run(self) -> None:
        while True:
            job, fail, done = self._jobs.get()
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - the save's caller sees it
                fail(e)
            finally:
                done.set()
