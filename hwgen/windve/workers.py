"""WindVE instances: one child process per instance, each with its own model copy.

An :class:`InstanceWorker` spawns a process (``multiprocessing`` "spawn" context) that pins
itself to the instance's cores (``os.sched_setaffinity``), lowers its priority below the
service's front end (:data:`WORKER_NICE`), sets its PyTorch thread count, loads
:class:`~hwgen.windve.model.MiniLM` on the instance's device and then embeds the text
lists it receives over a pipe. An :class:`InstanceRunner` thread in the service process takes
batches from the instance's :class:`~hwgen.windve.queues.DeviceQueue`, sends them to the
worker and answers every request of the batch. When the worker dies mid-batch (killed, out of
memory), the runner restarts it and puts the batch back at the front of the queue; a batch that
fails ``max_attempts`` times is answered with :class:`InstanceFailed` (HTTP 503) instead, so no
accepted request is dropped silently.
"""

import multiprocessing
import os
import threading
import time

import numpy as np

__all__ = ["InstanceFailed", "InstanceRunner", "InstanceWorker", "WorkerDied", "start_runners",
           "stop_runners"]

#: Seconds a worker may take to load its model.
START_TIMEOUT = 300.0
#: Niceness a worker adds to its own (``os.nice``): where instances share cores with the
#: service process, its HTTP front end (admission, 429s, ``/health``) runs first and stays
#: responsive under overload; on cores of their own the workers lose nothing.
WORKER_NICE = 5


class WorkerDied(RuntimeError):
    """The instance's process ended or its pipe broke."""


class InstanceFailed(RuntimeError):
    """A request's batch failed on its instance ``max_attempts`` times."""


def _worker_main(conn, threads, cores, device, truncate):
    """Child process: affinity, threads, model; then embed until told to stop."""
    try:
        if cores:
            os.sched_setaffinity(0, cores)
        os.nice(WORKER_NICE)
        start = time.monotonic()
        from ..models.minilm import MiniLM
        model = MiniLM(threads=threads, device=device)      # sets the torch thread count
        conn.send(("ready", time.monotonic() - start))
    except Exception as e:         # reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        try:
            conn.send(("ok", model.encode(message, truncate=truncate)))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


class InstanceWorker:
    """The process of one :class:`~hwgen.windve.devices.Instance`."""

    def __init__(self, instance, truncate=True):
        self.instance = instance
        self.truncate = truncate
        self.process = None
        self._conn = None
        self.load_seconds = None
        self.restarts = -1

    def start(self, timeout=START_TIMEOUT):
        """Spawn the process and wait until its model is loaded."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        inst = self.instance
        self.process = ctx.Process(
            target=_worker_main, name=f"windve-{inst.name}", daemon=True,
            args=(child, inst.threads, tuple(inst.cores) if inst.cores else None,
                  inst.torch_device, self.truncate))
        self.process.start()
        child.close()
        self._conn = parent
        self.restarts += 1
        if not parent.poll(timeout):
            self.kill()
            raise WorkerDied(f"{inst.name}: the model did not load within {timeout:.0f} s")
        try:
            kind, value = parent.recv()
        except (EOFError, OSError):
            raise WorkerDied(f"{inst.name}: the worker exited while loading the model") \
                from None
        if kind != "ready":
            raise WorkerDied(f"{inst.name}: {value}")
        self.load_seconds = value
        return self

    @property
    def pid(self):
        """The worker process's id; None before :meth:`start`."""
        return self.process.pid if self.process else None

    def embed(self, texts):
        """Embeddings of ``texts`` (float32, one row per text); :class:`WorkerDied` when the
        process is gone, :class:`ValueError` for an error the model raised."""
        try:
            self._conn.send(list(texts))
            kind, value = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            raise WorkerDied(f"{self.instance.name}: the worker process died") from None
        if kind != "ok":
            raise ValueError(value)
        return np.asarray(value, dtype=np.float32)

    def stop(self, timeout=5.0):
        """Ask the worker process to exit and wait up to ``timeout`` seconds, then kill it."""
        if self.process is None:
            return
        try:
            self._conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()

    def kill(self):
        """Kill the worker process if it is alive and reap it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class InstanceRunner(threading.Thread):
    """Feeds one worker from one queue (see module docstring).

    ``on_batch(queue_name, requests, seconds)`` is called after every answered batch (the
    service's metrics); ``on_restart(instance_name)`` after every worker restart.
    """

    def __init__(self, worker, queue, *, max_batch=32, max_wait=0.005, max_attempts=3,
                 on_batch=None, on_restart=None):
        super().__init__(name=f"runner-{worker.instance.name}", daemon=True)
        self.worker = worker
        self.queue = queue
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_attempts = max_attempts
        self.on_batch = on_batch
        self.on_restart = on_restart
        self.batches = 0
        self.dead = False
        self.error = None
        self.crashes = 0
        #: ``time.monotonic()`` when the batch in flight was sent (None when idle).
        self.busy_since = None

    def stuck(self, limit):
        """True when the batch in flight was sent more than ``limit`` seconds ago."""
        since = self.busy_since
        return since is not None and time.monotonic() - since > limit

    def run(self):
        """Take batches until the queue is closed and drained. An unexpected exception does
        not end the thread: the batch is answered with :class:`InstanceFailed` (HTTP 503),
        the worker restarted and the loop goes on."""
        while True:
            batch = []
            try:
                batch = self.queue.take_batch(self.max_batch, self.max_wait)
                if not batch:
                    return
                self._serve(batch)
            except Exception as e:             # a bug must not strand the queue's requests
                self.crashes += 1
                self.error = f"{type(e).__name__}: {e}"
                unanswered = [r for r in batch if not r.future.done()]
                for request in unanswered:
                    request.future.set_exception(InstanceFailed(self.error))
                if unanswered:              # else _serve finished the batch already
                    self.queue.finish(batch)
                self._restart()
            finally:
                self.busy_since = None

    def _serve(self, batch):
        """Embed one batch and answer its requests."""
        if self.dead:
            for request in batch:
                request.future.set_exception(InstanceFailed(
                    f"{self.worker.instance.name} cannot be restarted: {self.error}"))
            self.queue.finish(batch)
            return
        texts = [t for request in batch for t in request.texts]
        start = self.busy_since = time.monotonic()
        try:
            vectors = self.worker.embed(texts)
        except WorkerDied as e:
            for request in self.queue.requeue(batch, self.max_attempts):
                request.future.set_exception(InstanceFailed(str(e)))
            self._restart()
            return
        except ValueError as e:
            for request in batch:
                request.future.set_exception(e)
            self.queue.finish(batch)
            return
        row = 0
        for request in batch:
            request.future.set_result(vectors[row:row + request.size])
            row += request.size
        self.queue.finish(batch)
        self.batches += 1
        if self.on_batch:
            self.on_batch(self.queue.name, batch, time.monotonic() - start)

    def _restart(self):
        """Restart the worker; after ``max_attempts`` failed starts the runner is dead and
        answers every batch it takes with :class:`InstanceFailed`."""
        for _ in range(self.max_attempts):
            self.worker.kill()
            try:
                self.worker.start()
            except WorkerDied as e:
                self.error = str(e)
                time.sleep(1.0)
                continue
            if self.on_restart:
                self.on_restart(self.worker.instance.name)
            return
        self.dead = True


def start_runners(instances, queue, *, truncate=True, log=None, **options):
    """Start a worker (loading its model copy) and a runner feeding it from ``queue`` for
    every instance; ``options`` go to :class:`InstanceRunner`. Returns the runners."""
    runners = []
    for inst in instances:
        worker = InstanceWorker(inst, truncate=truncate).start()
        if log:
            log(f"{queue.name} queue: {inst.name} ready (pid {worker.pid}, model loaded in "
                f"{worker.load_seconds:.1f} s)")
        runner = InstanceRunner(worker, queue, **options)
        runner.start()
        runners.append(runner)
    return runners


def stop_runners(runners, timeout=None):
    """Wait for the runners (their queue closed and drained), then stop their workers."""
    for runner in runners:
        runner.join(timeout)
        runner.worker.stop()
