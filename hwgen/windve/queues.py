"""WindVE's queue manager (paper Algorithm 1): bounded device queues and the dispatch rule.

A request (one ``POST /v1/embeddings``, one or more texts) goes to the main device's queue if it
has room, else, with heterogeneous computing on, to the CPU queue if that has room, else it is
answered BUSY at once (the service turns that into HTTP 429). A queue's *occupancy* counts the
texts waiting in it plus the texts its instances are embedding; it is full when one more
request would take it past its depth ``C_max`` (the paper's queue length, which it sets to the
largest concurrency a device serves within the SLO). Occupancy is counted in texts, so a
request of 8 texts weighs as much as 8 single-text requests.

Instances take batches from their queue (:meth:`DeviceQueue.take_batch`: up to ``max_batch``
texts, waiting at most ``max_wait`` seconds for more after the first request). Nothing accepted
is lost: a batch whose instance fails goes back to the front of its queue
(:meth:`DeviceQueue.requeue`), and after ``max_attempts`` failures its requests are answered
with the error instead. :meth:`DeviceQueue.close` lets instances drain what was accepted and
then stop.

Thread-safe: the HTTP handlers dispatch from the event loop, the instances' threads take
batches; results travel in :class:`concurrent.futures.Future` objects.
"""

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

__all__ = ["BUSY", "DeviceQueue", "QueueManager", "Request"]

#: :meth:`QueueManager.dispatch`'s answer when every eligible queue is full.
BUSY = None


@dataclass
class Request:
    """One accepted request: its texts, the future its embeddings go to, and bookkeeping."""
    texts: list
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    attempts: int = 0
    device: str = ""

    @property
    def size(self):
        """Texts in the request."""
        return len(self.texts)


class DeviceQueue:
    """The bounded queue of one device role (``"main"`` or ``"cpu"``).

    ``depth`` is ``C_max`` in texts. :meth:`try_put` never blocks; :meth:`take_batch` blocks an
    instance until there is work or the queue is closed and empty (then it returns ``[]``).
    """

    def __init__(self, name, depth):
        if depth < 1:
            raise ValueError(f"queue {name}: depth must be at least 1, not {depth}")
        self.name = name
        self.depth = depth
        self._waiting = collections.deque()
        self._in_service = 0
        self._closed = False
        self._cond = threading.Condition()
        self.accepted = 0            # requests
        self.completed = 0
        self.requeued = 0
        self.failed = 0

    @property
    def occupancy(self):
        """Texts waiting plus texts being embedded."""
        with self._cond:
            return self._occupancy()

    def _occupancy(self):
        return sum(r.size for r in self._waiting) + self._in_service

    def try_put(self, request):
        """Accept ``request`` if it fits under the depth (and the queue is open)."""
        with self._cond:
            if self._closed or self._occupancy() + request.size > self.depth:
                return False
            request.device = self.name
            self._waiting.append(request)
            self.accepted += 1
            self._cond.notify()
            return True

    def take_batch(self, max_batch, max_wait):
        """Up to ``max_batch`` texts of whole requests (at least one request, even a larger
        one), waiting up to ``max_wait`` seconds after the first for the batch to fill. The
        texts count as in service until :meth:`finish` or :meth:`requeue`."""
        with self._cond:
            while not self._waiting:
                if self._closed:
                    return []
                self._cond.wait(0.5)
            batch = [self._waiting.popleft()]
            texts = batch[0].size
            self._in_service += texts       # counted at once: the wait below releases the lock
            deadline = time.monotonic() + max_wait
            while texts < max_batch:
                if self._waiting and texts + self._waiting[0].size <= max_batch:
                    request = self._waiting.popleft()
                    batch.append(request)
                    texts += request.size
                    self._in_service += request.size
                    continue
                if self._waiting:          # the next request does not fit this batch
                    break
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    break
                self._cond.wait(min(left, 0.5))    # bounded: an infinite wait overflows
            return batch

    def finish(self, batch):
        """The batch's requests are answered (their futures set by the caller)."""
        with self._cond:
            self._in_service -= sum(r.size for r in batch)
            self.completed += len(batch)
            self._cond.notify_all()

    def requeue(self, batch, max_attempts):
        """Put a failed batch back at the front; requests that failed ``max_attempts`` times
        are returned instead (the caller answers them with the error)."""
        given_up = []
        with self._cond:
            self._in_service -= sum(r.size for r in batch)
            for request in reversed(batch):
                request.attempts += 1
                if request.attempts >= max_attempts:
                    given_up.append(request)
                    self.failed += 1
                else:
                    self._waiting.appendleft(request)
                    self.requeued += 1
            self._cond.notify_all()
        return given_up

    def close(self):
        """Accept nothing more; instances drain what is queued, then get ``[]``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_empty(self, timeout=None):
        """Block until nothing is waiting or in service (drain); returns whether it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._waiting or self._in_service:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.5 if left is None else min(left, 0.5))
            return True

    def snapshot(self):
        """The queue's state for ``/health``: depth and occupancy (texts), waiting requests and the
        request counters (accepted, completed, requeued, failed)."""
        with self._cond:
            return {"depth": self.depth, "occupancy": self._occupancy(),
                    "waiting": len(self._waiting), "accepted": self.accepted,
                    "completed": self.completed, "requeued": self.requeued,
                    "failed": self.failed}


class QueueManager:
    """Algorithm 1: main queue first, the CPU queue on overflow when heterogeneous, else BUSY.

    ``cpu`` is None when there is no auxiliary queue (one device kind, or heterogeneous off).
    """

    def __init__(self, main, cpu=None, heterogeneous=False):
        self.main = main
        self.cpu = cpu if heterogeneous else None
        self.heterogeneous = bool(heterogeneous and cpu is not None)
        self.rejected = 0
        self._lock = threading.Lock()

    @property
    def queues(self):
        """The queues in use: the main one, then the CPU one if there is one."""
        return [q for q in (self.main, self.cpu) if q is not None]

    def largest_request(self):
        """Texts of the largest request any queue can ever take."""
        return max(q.depth for q in self.queues)

    def dispatch(self, request, main_only=False):
        """Queue ``request``; returns the queue's name (``"main"``/``"cpu"``) or :data:`BUSY`.
        ``main_only`` skips the overflow (the paper's baseline, measured on the same
        service)."""
        if self.main.try_put(request):
            return self.main.name
        if self.cpu is not None and not main_only and self.cpu.try_put(request):
            return self.cpu.name
        with self._lock:
            self.rejected += 1
        return BUSY

    def close(self):
        """Close every queue (see :meth:`DeviceQueue.close`)."""
        for q in self.queues:
            q.close()
