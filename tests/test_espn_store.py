"""ESPN's token store: aligned layout, every reader returns the same tokens, O_DIRECT and the
background fetch, errors; the cgroup memory budget; the corpora."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hwgen.errors import ConfigError, ToolError
from hwgen.espn.host import budget, corpus
from hwgen.espn.host.store import BLOCK, STORES, DirectStore, StoreWriter, open_store

DIM = 24


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """60 documents of 1..300 tokens: odd sizes, one token, exactly two blocks (4096 * 2 bytes
    = 512 tokens of 8 bytes would not divide 48-byte rows: 256 rows = 12,288 bytes = 3 blocks),
    and one token past three blocks."""
    rng = np.random.default_rng(3)
    sizes = list(rng.integers(1, 300, size=57)) + [1, 256, BLOCK * 3 // (DIM * 2) + 1]
    docs = [rng.standard_normal((int(n), DIM)).astype(np.float16) for n in sizes]
    path = tmp_path_factory.mktemp("espn-store") / "tokens.bin"
    writer = StoreWriter(path, DIM)
    for d in docs:
        writer.add(d)
    offsets, ntokens = writer.close()
    return path, offsets, ntokens, docs


def test_layout_is_aligned_and_compact(token_file):
    path, offsets, ntokens, docs = token_file
    assert (offsets % BLOCK == 0).all()
    extents = np.diff(np.append(offsets, os.path.getsize(path)))
    need = -(-ntokens.astype(np.int64) * DIM * 2 // BLOCK) * BLOCK
    assert (extents == need).all()               # each document: the fewest whole blocks
    assert list(ntokens) == [d.shape[0] for d in docs]


@pytest.mark.parametrize("kind", STORES)
def test_every_reader_returns_the_written_tokens(token_file, kind):
    path, offsets, ntokens, docs = token_file
    order = np.random.default_rng(5).permutation(len(docs))
    with open_store(kind, path, offsets, ntokens, DIM, threads=4) as store:
        got = store.read(order)
        for d in order:
            assert got[int(d)].dtype == np.float16
            assert np.array_equal(got[int(d)], docs[d]), (kind, d)
        if kind != "ram":
            assert store.bytes_read == sum(store.extent(int(d)) for d in order)


def test_fetch_in_background_calls_back_once_per_document(token_file):
    path, offsets, ntokens, docs = token_file
    seen = []
    with DirectStore(path, offsets, ntokens, DIM, threads=8) as store:
        wanted = list(range(0, len(docs), 3))
        fetch = store.submit(wanted, on_arrival=lambda d, t: seen.append((d, t.shape[0])))
        got = fetch.wait()
        assert fetch.done()
        assert sorted(got) == wanted
        assert sorted(seen) == [(d, docs[d].shape[0]) for d in wanted]
        assert store.submit([], urgent=True).wait() == {}


def test_fetch_stopped_keeps_what_started_and_reads_nothing_else(token_file):
    """``stop`` names the documents whose read started; only those are ever read, each once,
    and ``wait`` on them returns their tokens."""
    path, offsets, ntokens, docs = token_file
    with DirectStore(path, offsets, ntokens, DIM, threads=2) as store:
        reads, read_one = [], store._read_one

        def slow(doc):                       # 5 ms a read: the queue cannot drain in 12 ms
            reads.append(doc)
            time.sleep(0.005)
            return read_one(doc)
        store._read_one = slow
        wanted = list(range(40))
        fetch = store.submit(wanted)
        time.sleep(0.012)
        started = fetch.stop()
        assert 0 < len(started) < len(wanted) and started == wanted[:len(started)]
        got = fetch.wait(started)
        assert sorted(got) == sorted(started)
        for d in started:
            assert np.array_equal(got[d], docs[d])
        assert fetch.stop() == started and fetch.wait().keys() == set(started)
        sync = store.read_sync([7, 3])
        assert list(sync) == [7, 3] and np.array_equal(sync[3], docs[3])
    # nothing read after the stop, nothing twice (then the two synchronous reads)
    assert sorted(reads[:-2]) == sorted(started) and reads[-2:] == [7, 3]


def test_read_errors_reach_the_caller(token_file, tmp_path):
    path, offsets, ntokens, _ = token_file
    bad = np.append(offsets, os.path.getsize(path) + BLOCK)       # past the end of the file
    with pytest.raises(ConfigError, match="tokens.bin: document 60 ends at byte"):
        DirectStore(path, bad, np.append(ntokens, 10), DIM, threads=2)
    copy = tmp_path / "tokens.bin"                 # a file that shrinks after it is opened
    copy.write_bytes(path.read_bytes())
    with DirectStore(copy, offsets, ntokens, DIM, threads=2) as store:
        os.truncate(copy, int(offsets[-1]))
        with pytest.raises(ConfigError, match=f"{copy}: short read of document 59"):
            store.submit([len(offsets) - 1]).wait()


def test_writer_and_open_store_refuse_bad_input(tmp_path):
    writer = StoreWriter(tmp_path / "t.bin", DIM)
    with pytest.raises(ValueError, match="shape"):
        writer.add(np.zeros((0, DIM)))
    with pytest.raises(ValueError, match="shape"):
        writer.add(np.zeros((3, DIM + 1)))
    writer.close()
    with pytest.raises(ConfigError, match="store='disk'"):
        open_store("disk", tmp_path / "t.bin", [], [], DIM)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_o_direct_on_tmpfs_is_one_clear_error():
    path = f"/dev/shm/hwgen-espn-{os.getpid()}.bin"
    writer = StoreWriter(path, DIM)
    writer.add(np.ones((3, DIM), np.float16))
    offsets, ntokens = writer.close()
    try:
        try:                    # what this kernel says of O_DIRECT on tmpfs, asked directly
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            kernel_accepts = True
        except OSError:
            kernel_accepts = False
        if kernel_accepts:      # newer kernels: the store must then work
            with DirectStore(path, offsets, ntokens, DIM) as store:
                assert np.array_equal(store.read([0])[0], np.ones((3, DIM), np.float16))
        else:
            with pytest.raises(ToolError, match="O_DIRECT"):
                DirectStore(path, offsets, ntokens, DIM)
    finally:
        os.unlink(path)


@pytest.mark.skipif(not budget.available()[0], reason="needs a writable cgroup memory "
                    "controller (root); CI runs as root")
def test_memory_budget_is_enforced():
    hog = [sys.executable, "-c", "b = bytearray(400 << 20); print(len(b))"]
    code, peak, oom = budget.run_limited(hog, 200 << 20)
    assert oom and code == -9
    code, peak, oom = budget.run_limited(hog, 800 << 20)
    assert code == 0 and not oom and peak >= 400 << 20


def _resident_pages(path):
    """Pages of ``path`` in the page cache: mincore(2) on a read-only mapping of the file."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    fd = os.open(path, os.O_RDONLY)
    try:
        base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            if libc.mincore(base, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            libc.munmap(base, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def _fs_type(path):
    """The file system type of the mount holding ``path`` (/proc/mounts' longest prefix)."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/mounts") as f:
        for line in f:
            _, mount, kind = line.split()[:3]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and \
                    len(mount) > len(best[0]):
                best = (mount, kind)
    return best[1]


def test_drop_cache_evicts_the_file(token_file):
    """Read (every page cached), then dropped: no page of the file is left in the cache."""
    path = token_file[0]
    if _fs_type(path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{path} is on {_fs_type(path)}: its pages cannot leave memory")
    os.sync()                                   # dirty pages are not dropped
    with open(path, "rb") as f:
        f.read()
    assert _resident_pages(path) > 0
    budget.drop_cache(path)
    assert _resident_pages(path) == 0


# ---------------------------------------------------------------- corpora

def test_split_passages_respects_the_word_limit():
    text = ("One short sentence. " * 30) + " ".join(["long"] * 250) + ". Tail end here now."
    passages = corpus.split_passages(text, words=40, min_words=3)
    assert all(3 <= len(p.split()) <= 40 for p in passages)
    assert " ".join(" ".join(passages).split()) == " ".join(text.split())


def test_lee_corpus_and_its_human_judgements():
    pytest.importorskip("gensim")
    docs = corpus.lee_documents()
    human = corpus.lee_similarities()
    assert len(docs) == 50 and human.shape == (50, 50)
    assert np.allclose(human, human.T) and np.allclose(np.diag(human), 1)
    assert 0 <= human.min() and human.max() <= 1
    passages = corpus.load("lee", limit=70)
    assert len(passages) == 70 and passages[0].source.startswith("lee/lee.cor#0")


def test_corpus_files_and_bad_names(tmp_path):
    good = tmp_path / "c.txt"
    good.write_text("First passage has enough words to be kept here.\n\n"
                    "Second passage also has enough words to be kept.\n\ntoo short\n")
    assert [p.text.split()[0] for p in corpus.load(str(good))] == ["First", "Second"]
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"text": "A passage from a json lines file with words."}\n[1]\n')
    with pytest.raises(ConfigError, match=r"c.jsonl:2: expected an object"):
        corpus.load(str(jl))
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00" * 100)
    with pytest.raises(ConfigError, match="not UTF-8"):
        corpus.load(str(binary))
    with pytest.raises(ConfigError, match="neither a known corpus"):
        corpus.load("no-such-corpus")
    with pytest.raises(ConfigError, match="limit=0"):
        corpus.load("papers", limit=0)
    empty = tmp_path / "e.txt"
    empty.write_text("tiny\n")
    with pytest.raises(ConfigError, match="no passage"):
        corpus.load(str(empty))


def test_pydoc_corpus_is_deterministic():
    code = ("from hwgen.espn.host import corpus; ps = corpus.load('pydoc', limit=300); "
            "print(len(ps), hash(tuple(p.text for p in ps)) & 0xffff)")
    env = dict(os.environ, PYTHONHASHSEED="0")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True).stdout for _ in range(2)}
    assert len(runs) == 1 and runs.pop().startswith("300 ")


def test_python_source_corpus_reads_docstrings_and_comments(tmp_path):
    """``pysource``: every docstring (private ones too) and each run of comment lines of the
    library's files, tests left out, in sorted file order; no module is imported."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        '#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n"""Module words here."""\n'
        '# first comment line\n# second comment line\nimport sys\n\n'
        'class A:\n    """Class words."""\n    def _f(self):\n        """Private too."""\n'
        '        return 1  # trailing words\n'
        'raise SystemExit("importing this would exit")\n')
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text('"""A test module: left out."""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    got = list(corpus.python_source(tmp_path))
    assert got == [("Module words here.", "pysource/pkg/mod.py:1"),
                   ("Class words.", "pysource/pkg/mod.py:8"),
                   ("Private too.", "pysource/pkg/mod.py:10"),
                   ("first comment line second comment line", "pysource/pkg/mod.py:4#"),
                   ("trailing words", "pysource/pkg/mod.py:12#")]
    assert "pysource" in corpus.EXTRA_CORPORA and "pysource" not in corpus.CORPORA
