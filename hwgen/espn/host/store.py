"""The token-embedding store: every document's token embeddings in 4 KiB-aligned blocks of one file.

File layout (``tokens.bin`` of an index folder): document ``d`` starts at byte ``offsets[d]``, a
multiple of :data:`BLOCK` (4096), and holds ``ntokens[d] x dim`` float16 values row by row (one
token per row), zero-padded to the next multiple of :data:`BLOCK`. Only the offset table
(``offsets``, ``ntokens``: 12 bytes per document) lives in memory.

Readers, all over the same file and returning the same arrays (``{doc: float16 (n, dim)}``):

* :class:`RamStore` — the whole file read into memory once (the in-memory baseline);
* :class:`MmapStore` — ``np.memmap`` of the file; ``cold=True`` evicts the file's pages from the
  page cache (``posix_fadvise(DONTNEED)``) and from the mapping (``madvise(DONTNEED)``) before each
  read, the state of a mapping under a memory budget far below the file;
* :class:`DirectStore` — ``O_DIRECT`` reads (no page cache: the memory budget is real) of each
  document's blocks into page-aligned buffers, issued by a pool of threads (``os.preadv`` releases
  the GIL, so ``threads`` requests are in flight at once; 4 by default, what measured best
  on 2 cores) — the asynchronous path; ``submit``
  returns a :class:`Fetch` whose documents arrive in the background and which can be stopped
  (the reads not yet started are dropped, the others reused). With ``threads=1`` and
  :meth:`DirectStore.read` (or :meth:`DirectStore.read_sync` on any store) it is the
  synchronous baseline. io_uring is not used: Python's standard
  library has no binding for it and none is installed here; a thread pool of ``pread`` is the
  issue's stated fallback.
"""

import mmap
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import ConfigError, ToolError

__all__ = ["BLOCK", "StoreWriter", "RamStore", "MmapStore", "DirectStore", "Fetch", "open_store",
           "STORES"]

#: Alignment and size unit of every document's extent (bytes).
BLOCK = 4096
#: Bytes per stored value (float16).
ITEM = 2

#: The reader names ``open_store`` and ``hwgen espn bench`` take.
STORES = ("ram", "mmap", "mmap-cold", "direct", "direct-sync")


def _extent(ntokens, dim):
    """Bytes a document of ``ntokens`` tokens takes in the file (a multiple of BLOCK)."""
    return -(-max(1, ntokens * dim * ITEM) // BLOCK) * BLOCK


class StoreWriter:
    """Appends documents to ``path`` in aligned blocks; :meth:`close` returns the offset table."""

    def __init__(self, path, dim):
        self.path, self.dim = path, dim
        self._f = open(path, "wb")
        self.offsets, self.ntokens = [], []
        self._at = 0

    def add(self, tokens):
        """Append one document's token embeddings (``(n, dim)``, stored as float16)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.float16)
        if tokens.ndim != 2 or tokens.shape[1] != self.dim or tokens.shape[0] < 1:
            raise ValueError(f"a document's tokens must have shape (n >= 1, {self.dim}), "
                             f"not {tokens.shape}")
        size = _extent(tokens.shape[0], self.dim)
        raw = tokens.tobytes()
        self._f.write(raw + bytes(size - len(raw)))
        self.offsets.append(self._at)
        self.ntokens.append(tokens.shape[0])
        self._at += size

    def close(self):
        """Flush and fsync the file and close it; returns ``(offsets int64, ntokens int32)``, the
        offset table of the documents added."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        return np.asarray(self.offsets, np.int64), np.asarray(self.ntokens, np.int32)


class _Store:
    """Common part: the offset table and the file."""

    name = None

    def __init__(self, path, offsets, ntokens, dim):
        self.path, self.dim = str(path), int(dim)
        self.offsets = np.asarray(offsets, np.int64)
        self.ntokens = np.asarray(ntokens, np.int32)
        self.bytes_read = 0          # bytes transferred from the file by reads since creation
        self.file_bytes = os.path.getsize(self.path)
        #: bytes each document's read transfers (its whole blocks), as :meth:`extent`
        self.extents = -(-np.maximum(1, self.ntokens.astype(np.int64) * self.dim * ITEM)
                         // BLOCK) * BLOCK
        ends = self.offsets + self.ntokens.astype(np.int64) * self.dim * ITEM
        if len(ends) and ends.max() > self.file_bytes:
            d = int(np.argmax(ends))
            raise ConfigError("index", f"{self.path}: document {d} ends at byte "
                              f"{int(ends[d]):,}, past the end of the file "
                              f"({self.file_bytes:,} bytes); rebuild the index",
                              value=os.path.dirname(self.path))

    def extent(self, doc):
        """Bytes the read of document ``doc`` transfers (a multiple of :data:`BLOCK`)."""
        return int(self.extents[doc])

    def resident_bytes(self):
        """Bytes this reader keeps in memory besides the offset table."""
        return 0

    def table_bytes(self):
        return self.offsets.nbytes + self.ntokens.nbytes

    def _view(self, buf, doc, start=0):
        n = int(self.ntokens[doc])
        return np.frombuffer(buf, np.float16, n * self.dim, start).reshape(n, self.dim)

    def read(self, docs):
        """``{doc: float16 (n, dim)}`` of ``docs``, read now (synchronously)."""
        raise NotImplementedError

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RamStore(_Store):
    """All token embeddings in memory (the in-memory baseline): no reads after loading."""

    name = "ram"

    def __init__(self, path, offsets, ntokens, dim):
        super().__init__(path, offsets, ntokens, dim)
        with open(self.path, "rb") as f:
            self._data = f.read()

    def resident_bytes(self):
        return len(self._data)

    def read(self, docs):
        return {int(d): self._view(self._data, d, int(self.offsets[d])) for d in docs}


class MmapStore(_Store):
    """The file mapped with ``np.memmap``; ``cold`` evicts it before every read (see module)."""

    def __init__(self, path, offsets, ntokens, dim, cold=False):
        super().__init__(path, offsets, ntokens, dim)
        self.cold = cold
        self.name = "mmap-cold" if cold else "mmap"
        self._fd = os.open(self.path, os.O_RDONLY)
        self._map = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)

    def evict(self):
        """Drop the file's pages from this mapping and from the page cache."""
        self._map.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read(self, docs):
        if self.cold:
            self.evict()
        out = {}
        for d in docs:
            d = int(d)
            # copy: the page faults happen here, as they would in the MaxSim that reads them
            out[d] = self._view(self._map, d, int(self.offsets[d])).copy()
            self.bytes_read += self.extent(d)
        return out

    def close(self):
        """Unmap the file and close its descriptor."""
        self._map.close()
        os.close(self._fd)


class Fetch:
    """Documents being read in the background by a :class:`DirectStore`.

    The store's ``threads`` workers take the documents from one queue in the order given, so
    ``threads`` reads are in flight and the first documents are read first.
    ``on_arrival(doc, tokens)``, when given, runs in the reading thread as each document
    arrives (ESPN's early re-ranking). ``urgent`` reads go to a second pool of threads, so
    that the critical path's reads do not queue behind a prefetch still in flight.

    :meth:`stop` keeps the reads not yet started from starting and names the documents whose
    read has started (in flight or done): ESPN reuses those instead of reading them again.
    :meth:`wait` returns ``{doc: tokens}`` of the documents asked for (all by default) once they
    have arrived, and re-raises a failed read's error.
    """

    def __init__(self, store, docs, on_arrival=None, urgent=False):
        self.docs = [int(d) for d in docs]
        self._queue = deque(self.docs)
        self._started = []
        self._results = {}
        self._error = None
        self._cond = threading.Condition()
        pool = store._urgent if urgent else store._pool
        self._futures = [pool.submit(self._work, store, on_arrival)
                         for _ in range(min(store.threads, len(self.docs)))]

    def _work(self, store, on_arrival):
        while True:
            with self._cond:
                if not self._queue or self._error is not None:
                    return
                doc = self._queue.popleft()
                self._started.append(doc)
            try:
                tokens = store._read_one(doc)
                if on_arrival is not None:
                    on_arrival(doc, tokens)
            except BaseException as e:
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                raise
            with self._cond:
                self._results[doc] = tokens
                self._cond.notify_all()

    def stop(self):
        """Start no more reads; returns the documents whose read has started (done or in
        flight), in the order they started. Reads in flight finish."""
        with self._cond:
            self._queue.clear()
            return list(self._started)

    def done(self):
        """Whether every read has finished (or failed); does not block."""
        return all(f.done() for f in self._futures)

    def wait(self, docs=None):
        """Block until the documents ``docs`` (default: every document not stopped) have
        arrived; ``{doc: float16 (n, dim)}`` of them. Re-raises the error of a failed read."""
        if docs is None:
            for f in self._futures:
                f.result()
            return dict(self._results)
        docs = [int(d) for d in docs]
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or
                                all(d in self._results for d in docs))
            if self._error is not None:
                raise self._error
            return {d: self._results[d] for d in docs}


class DirectStore(_Store):
    """``O_DIRECT`` reads by a pool of ``threads`` threads (see module docstring)."""

    def __init__(self, path, offsets, ntokens, dim, threads=4):
        super().__init__(path, offsets, ntokens, dim)
        if not hasattr(os, "O_DIRECT"):
            raise ToolError("O_DIRECT is not available on this platform")
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            raise ToolError(f"{self.path}: cannot open with O_DIRECT ({e.strerror}); put the "
                               "index on a disk file system (tmpfs has no O_DIRECT)") from None
        self.threads = threads
        self.name = "direct" if threads > 1 else "direct-sync"
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="espn-read")
        self._urgent = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="espn-urgent")
        self._count_lock = threading.Lock()
        self._local = threading.local()
        try:                        # a probe read: some file systems accept the flag, then fail
            self._read_one(0) if len(self.offsets) else None
            for pool in (self._pool, self._urgent):
                self._start_threads(pool)
            self.bytes_read = 0
        except ConfigError:
            self.close()
            raise
        except OSError as e:
            self.close()
            raise ToolError(f"{self.path}: O_DIRECT reads fail ({e.strerror}); put the "
                               "index on a disk file system") from None

    def _start_threads(self, pool):
        """Start all of ``pool``'s threads now, each with its read buffer, rather than on the
        first reads (a thread's start would count in a query's time)."""
        barrier = threading.Barrier(self.threads)

        def start():
            self._buffer(16 * BLOCK)
            barrier.wait(timeout=10)
        for f in [pool.submit(start) for _ in range(self.threads)]:
            f.result()

    def _buffer(self, size):
        """This thread's page-aligned buffer (O_DIRECT needs aligned memory) of >= size bytes."""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._local.buf = mmap.mmap(-1, max(size, 16 * BLOCK))
        return buf

    def _read_one(self, doc):
        size = self.extent(doc)
        buf = self._buffer(size)
        at = int(self.offsets[doc])
        got = os.preadv(self._fd, [memoryview(buf)[:size]], at)
        if got != size:
            raise ConfigError("index", f"{self.path}: short read of document {doc}: {got} of "
                              f"{size} bytes at byte {at:,}; the token file is truncated or "
                              "damaged, rebuild the index", value=os.path.dirname(self.path))
        with self._count_lock:
            self.bytes_read += size
        return self._view(buf, doc).copy()

    def submit(self, docs, on_arrival=None, urgent=False):
        """Start reading ``docs`` in the background; returns a :class:`Fetch`."""
        return Fetch(self, docs, on_arrival, urgent)

    def read_sync(self, docs):
        """``docs`` read one after another in the calling thread (``direct-sync``'s reads)."""
        return {int(d): self._read_one(int(d)) for d in docs}

    def read(self, docs):
        """``docs`` read now: one after another with ``threads=1`` (:meth:`read_sync`), else
        ``threads`` at once on the critical path's pool."""
        if self.threads == 1:
            return self.read_sync(docs)
        return self.submit(docs, urgent=True).wait()

    def close(self):
        """Wait for the reads in flight, stop both thread pools and close the file."""
        self._pool.shutdown(wait=True)
        self._urgent.shutdown(wait=True)
        os.close(self._fd)


def open_store(kind, path, offsets, ntokens, dim, threads=4):
    """A reader of ``kind`` (one of :data:`STORES`) over the token file ``path``."""
    if kind == "ram":
        return RamStore(path, offsets, ntokens, dim)
    if kind in ("mmap", "mmap-cold"):
        return MmapStore(path, offsets, ntokens, dim, cold=kind == "mmap-cold")
    if kind == "direct":
        return DirectStore(path, offsets, ntokens, dim, threads=threads)
    if kind == "direct-sync":
        return DirectStore(path, offsets, ntokens, dim, threads=1)
    raise ConfigError("store", f"choose one of {', '.join(STORES)}", value=kind)
