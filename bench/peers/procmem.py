"""Memory of processes, from /proc (Linux).

- The trainer's own peak: VmHWM, reset to the current RSS by writing 5 to
  /proc/self/clear_refs, so that a rank measures the peak of the method's
  saves above the RSS it had with its state built.
- Writer processes the method starts (DCP's process executor, torch_
  checkpointing's background writer): a sampler thread follows this
  process's descendants and keeps each one's last-seen VmHWM (monotonic
  while it lives, so the last sample is its peak up to then).
"""

import os
import threading


def status_kib(pid, field):
    """A `field:  N kB` line of /proc/<pid>/status, in KiB (None if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def reset_peak():
    """Resets this process's VmHWM to its current RSS; False if the kernel
    refused (then the peak includes what came before)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_bytes(pid="self"):
    v = status_kib(pid, "VmRSS")
    return None if v is None else v * 1024


def peak_bytes(pid="self"):
    v = status_kib(pid, "VmHWM")
    return None if v is None else v * 1024


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def descendants(pid):
    seen, todo = [], children(pid)
    while todo:
        c = todo.pop()
        seen.append(c)
        todo.extend(children(c))
    return seen


class DescendantPeaks:
    """Samples the VmHWM of every descendant of this process every
    `interval` seconds on a daemon thread; total() is the sum over the
    descendants of each one's peak (they run side by side)."""

    def __init__(self, interval=0.1):
        self._interval = interval
        self._peaks = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-bench-rss",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        me = os.getpid()
        while not self._stop.wait(self._interval):
            self.sample(me)

    def sample(self, me=None):
        for c in descendants(me or os.getpid()):
            hwm = peak_bytes(c)
            if hwm is not None:
                self._peaks[c] = max(self._peaks.get(c, 0), hwm)

    def stop(self):
        self.sample()
        self._stop.set()
        self._thread.join()

    def total(self):
        return sum(self._peaks.values())

    def count(self):
        return len(self._peaks)
