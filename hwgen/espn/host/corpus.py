"""Offline corpora for ESPN: passages of text that exist on this machine without a download.

A corpus is named on the command line (``hwgen espn index CORPUS``) by one of

* ``papers`` — the five papers behind hwgen (``../shared/papers/*.txt`` or ``$HWGEN_PAPERS``),
* ``lee`` — gensim's Lee corpus: the 50 news documents that carry human similarity judgements
  (``lee.cor``) and the 300 background documents (``lee_background.cor``),
* ``wiki`` — gensim's English Wikipedia extract (206 articles, wiki markup stripped by gensim),
* ``pydoc`` — the docstrings of Python's standard library modules, classes and functions,
* ``all`` — all four, in that order,
* ``pysource`` — the standard library's source read as text (:func:`python_source`): every
  docstring of every module, class and function (``ast``, private ones included) and every block
  of consecutive comment lines (``tokenize``), tests and GUI packages left out; with ``all``
  (``all+pysource``) it is the largest real corpus here without copies (``pydoc``'s docstrings
  recur in it and are kept once),
* a path: a ``.txt`` file (passages separated by blank lines), a ``.jsonl`` file (one
  ``{"text": ...}`` per line) or a folder of ``.txt`` files;

several may be joined with ``+`` (``lee+papers``). Paths must be regular files (FIFOs, devices and
files under ``/proc`` or ``/sys`` are refused before anything is read); the files of
a corpus together hold at most :data:`MAX_CORPUS_BYTES` bytes, a folder at most
:data:`MAX_CORPUS_FILES` ``.txt`` files. Long texts are cut into passages of at most
``words`` words on sentence boundaries where possible, as MS MARCO's passages are (about 60
words); passages of fewer than ``min_words`` words are dropped, exact duplicates once kept.
"""

import ast
import bz2
import importlib
import io
import inspect
import json
import os
import pkgutil
import re
import stat
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from ... import checks
from ...errors import ConfigError, ToolError

__all__ = ["Passage", "CORPORA", "load", "check", "lee_documents", "lee_similarities",
           "papers_dir", "python_source", "split_passages", "EXTRA_CORPORA", "MAX_CORPUS_BYTES",
           "MAX_CORPUS_FILES"]

#: Most bytes the files named by one corpus spec may hold together (64 MiB).
MAX_CORPUS_BYTES = 64 << 20
#: Most ``.txt`` files a corpus folder may hold.
MAX_CORPUS_FILES = 10_000
#: Pseudo file systems whose "files" are not text a corpus can come from.
_PSEUDO = ("/proc", "/sys")

#: Names a corpus may be given by, in the order ``all`` loads them.
CORPORA = ("papers", "lee", "wiki", "pydoc")
#: Corpora by name that ``all`` leaves out (``all`` keeps the passages the README's copied
#: stress index was built from).
EXTRA_CORPORA = ("pysource",)


@dataclass(frozen=True)
class Passage:
    """One passage: its text and where it came from (``source``: corpus and document)."""
    text: str
    source: str


def _gensim_data(name):
    try:
        from gensim.test.utils import datapath
    except ImportError as e:
        raise ToolError("the lee and wiki corpora come with gensim's test data: "
                           "pip install gensim (the espn extra installs it)") from e
    return Path(datapath(name))


def papers_dir():
    """Folder of the papers: ``$HWGEN_PAPERS``, else ``shared/papers`` beside the checkout."""
    env = os.environ.get("HWGEN_PAPERS")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        for candidate in (parent / "shared" / "papers", parent.parent / "shared" / "papers"):
            if candidate.is_dir():
                return candidate
    raise ConfigError("corpus", "the papers corpus was not found: set HWGEN_PAPERS to the "
                      "folder of the "
                       "papers' .txt files")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_passages(text, words=80, min_words=8):
    """Cut ``text`` into passages of at most ``words`` words, ending on sentence boundaries
    where a sentence fits (a longer sentence is cut by words)."""
    passages, current = [], []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        tokens = sentence.split()
        start = 0
        while len(tokens) - start > words:    # a sentence longer than a passage
            if current:
                passages.append(current)
                current = []
            passages.append(tokens[start:start + words])
            start += words                    # an index, not a copy: linear in the words
        tokens = tokens[start:]
        if current and len(current) + len(tokens) > words:
            passages.append(current)
            current = []
        current += tokens
    if current:
        passages.append(current)
    return [" ".join(p) for p in passages if len(p) >= min_words]


def _papers():
    folder = papers_dir()
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        # paragraphs: the papers' text has one paragraph per line
        for k, paragraph in enumerate(p for p in text.splitlines() if p.strip()):
            yield paragraph, f"papers/{path.stem}#{k}"


def lee_documents():
    """The 50 documents of the Lee corpus that the human similarity matrix is about."""
    with open(_gensim_data("lee.cor"), encoding="latin-1") as f:
        return [line.strip() for line in f if line.strip()]


def lee_similarities():
    """The Lee corpus' 50x50 mean human similarity judgements (0..1), made symmetric.

    gensim's ``similarities0-1.txt`` fills the upper triangle (and the diagonal) only."""
    import numpy as np
    upper = np.loadtxt(_gensim_data("similarities0-1.txt"))
    if upper.shape != (50, 50):
        raise ToolError(f"similarities0-1.txt has shape {upper.shape}, expected (50, 50)")
    return np.triu(upper) + np.triu(upper, 1).T


def _lee():
    for k, doc in enumerate(lee_documents()):
        yield doc, f"lee/lee.cor#{k}"
    with open(_gensim_data("lee_background.cor"), encoding="latin-1") as f:
        for k, line in enumerate(f):
            if line.strip():
                yield line, f"lee/lee_background.cor#{k}"


def _wiki():
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    path = _gensim_data("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    with bz2.open(path) as f:
        for title, text, _ in extract_pages(f):
            plain = filter_wiki(text)
            # what filter_wiki leaves of tables and lists: lines of mostly symbols
            lines = [ln for ln in plain.splitlines()
                     if sum(c.isalpha() for c in ln) > 0.6 * max(1, len(ln.strip()))]
            yield " ".join(lines), f"wiki/{title}"


def _pydoc():
    """Docstrings of the standard library's importable pure-Python modules (deterministic)."""
    stdlib = Path(os.__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(stdlib)])
                   if not m.name.startswith(("_", "test", "idlelib", "tkinter", "turtle",
                                             "antigravity", "this")))
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:           # modules needing absent C extensions or a display
            continue
        seen = set()
        for qual, obj in [(name, module)] + sorted(
                (f"{name}.{a}", getattr(module, a, None)) for a in dir(module)
                if not a.startswith("_")):
            doc = inspect.getdoc(obj) if obj is not None else None
            if doc and doc not in seen and (obj is module or
                                            getattr(obj, "__module__", None) == name):
                seen.add(doc)
                yield doc, f"pydoc/{qual}"


#: Parts of the standard library's tree that ``pysource`` leaves out: tests (their strings are
#: data, not prose), GUI and demo packages, installed packages.
_SOURCE_SKIP = ("test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3",
                "site-packages", "dist-packages", "__pycache__")


def _comment_blocks(source):
    """``(first line, text)`` of each run of comment lines on consecutive lines of
    ``source``; ``#!`` and coding lines are left out."""
    blocks, last = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        text = tok.string.lstrip("#").strip()
        if row <= 2 and (tok.string.startswith("#!") or "coding" in text):
            continue
        if blocks and row == last + 1:
            blocks[-1][1].append(text)
        else:
            blocks.append((row, [text]))
        last = row
    return [(row, " ".join(lines)) for row, lines in blocks]


def python_source(root=None):
    """``(text, source)`` of the standard library's docstrings and comment blocks, file by file
    in sorted order, each file's docstrings (in ``ast.walk`` order) before its comments;
    ``root``: the library folder (default: the running Python's). A file that does not parse
    is skipped."""
    root = Path(os.__file__).parent if root is None else Path(root)
    files = sorted(p for p in root.rglob("*.py")
                   if not any(part in _SOURCE_SKIP or part.startswith("test_")
                              for part in p.relative_to(root).parts))
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            comments = _comment_blocks(source)
        except (SyntaxError, UnicodeDecodeError, ValueError, tokenize.TokenError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc, f"pysource/{rel}:{getattr(node, 'lineno', 1)}"
        for line, text in comments:
            yield text, f"pysource/{rel}:{line}#"


def _pysource():
    return python_source()


_LOADERS = {"papers": _papers, "lee": _lee, "wiki": _wiki, "pydoc": _pydoc,
            "pysource": _pysource}


def _checked_file(path):
    """``path`` (a corpus file or folder) as a Path and its ``os.stat``, refusing anything but
    a regular file or folder outside the pseudo file systems (``/dev/zero`` would be read
    forever, a FIFO blocks)."""
    real = os.path.realpath(path)
    if any(real == p or real.startswith(p + "/") for p in _PSEUDO):
        raise ConfigError("corpus", f"{real} is in a pseudo file system, not a text file",
                          value=str(path))
    return Path(path), checks.stat_input(path, "corpus", folders=True)


def _path_files(part):
    """The files of the path ``part`` (itself, or a folder's ``.txt`` files), checked."""
    path, st = _checked_file(part)
    if not stat.S_ISDIR(st.st_mode):
        return [(path, st.st_size)]
    files = []
    for file in path.rglob("*.txt"):
        if len(files) >= MAX_CORPUS_FILES:
            raise ConfigError("corpus", f"folder holds more than {MAX_CORPUS_FILES:,} .txt "
                              "files", value=str(path))
        file, fst = _checked_file(file)
        if stat.S_ISDIR(fst.st_mode):
            raise ConfigError("corpus", "is a folder named .txt", value=str(file))
        files.append((file, fst.st_size))
    if not files:
        raise ConfigError("corpus", f"folder {path} holds no .txt files")
    return sorted(files)


def _parts(spec):
    """``spec`` split on ``+`` with ``all`` expanded, each part a name or a list of files."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("corpus", "give a name (" +
                          ", ".join(CORPORA + EXTRA_CORPORA + ("all",)) + ") or a path")
    parts, total = [], 0
    for part in spec.split("+"):
        if part == "all":
            parts += list(CORPORA)
        elif part in _LOADERS:
            parts.append(part)
        elif os.path.lexists(part):
            files = _path_files(part)
            total += sum(size for _, size in files)
            if total > MAX_CORPUS_BYTES:
                raise ConfigError("corpus", f"its files hold {total:,} bytes or more; a corpus "
                                  f"is limited to {MAX_CORPUS_BYTES:,} bytes", value=spec)
            parts.append(files)
        else:
            raise ConfigError("corpus", f"{part!r} is neither a known corpus (" +
                              ", ".join(CORPORA + ("all",)) + ") nor an existing path")
    return parts


def check(spec):
    """Refuse a bad corpus ``spec`` (unknown name, missing path, a file that is not a regular
    file, over :data:`MAX_CORPUS_BYTES`) without reading any corpus: run it before loading a
    model."""
    _parts(spec)


def _path_documents(path):
    """(text, source) of one checked corpus file: ``.jsonl`` records or blank-line blocks."""
    text = checks.read_text(path, "corpus", limit=MAX_CORPUS_BYTES)
    if path.suffix == ".jsonl":
        for k, line in enumerate(text.split("\n")):      # JSON may hold U+2028
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError("corpus", f"{path}:{k + 1}: not JSON ({e.msg})") from None
            except RecursionError:
                raise ConfigError("corpus", f"{path}:{k + 1}: JSON nested too deeply") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ConfigError("corpus", f'{path}:{k + 1}: expected an object with a '
                                  '"text" string')
            yield record["text"], f"{path.name}#{k}"
        return
    for k, block in enumerate(re.split(r"\n\s*\n", text)):
        if block.strip():
            yield block, f"{path.name}#{k}"


def load(spec, words=80, min_words=8, limit=None):
    """Passages of the corpus ``spec`` (see the module docstring), at most ``limit``."""
    if limit is not None and limit < 1:
        raise ConfigError("limit", "must be at least 1", value=limit)
    passages, seen = [], set()
    for part in _parts(spec):
        if isinstance(part, str):
            documents = _LOADERS[part]()
        else:
            documents = (doc for path, _ in part for doc in _path_documents(path))
        for text, source in documents:
            for k, passage in enumerate(split_passages(text, words, min_words)):
                if passage in seen:
                    continue
                seen.add(passage)
                passages.append(Passage(passage, f"{source}/{k}"))
                if limit is not None and len(passages) >= limit:
                    return passages
    if not passages:
        raise ConfigError("corpus", f"{spec!r} has no passage of {min_words} words or more")
    return passages


if __name__ == "__main__":       # python -m hwgen.espn.host.corpus NAME: passage counts
    for name in sys.argv[1:] or CORPORA + EXTRA_CORPORA:
        found = load(name)
        print(name, len(found), sum(len(p.text.split()) for p in found))
