"""Offline corpora for ESPN: passages of text that exist on this machine without a download.

A corpus is named on the command line (``hwgen espn index CORPUS``) by one of

* ``papers`` — the five papers behind hwgen (``../shared/papers/*.txt`` or ``$HWGEN_PAPERS``),
* ``lee`` — gensim's Lee corpus: the 50 news documents that carry human similarity judgements
  (``lee.cor``) and the 300 background documents (``lee_background.cor``),
* ``wiki`` — gensim's English Wikipedia extract (206 articles, wiki markup stripped by gensim),
* ``pydoc`` — the docstrings of Python's standard library modules, classes and functions,
* ``all`` — all four, in that order,
* a path: a ``.txt`` file (passages separated by blank lines), a ``.jsonl`` file (one
  ``{"text": ...}`` per line) or a folder of ``.txt`` files;

several may be joined with ``+`` (``lee+papers``). Long texts are cut into passages of at most
``words`` words on sentence boundaries where possible, as MS MARCO's passages are (about 60
words); passages of fewer than ``min_words`` words are dropped, exact duplicates once kept.
"""

import bz2
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, ToolError

__all__ = ["Passage", "CORPORA", "load", "lee_documents", "lee_similarities", "papers_dir",
           "split_passages"]

#: Names a corpus may be given by, in the order ``all`` loads them.
CORPORA = ("papers", "lee", "wiki", "pydoc")


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
        while len(tokens) > words:            # a sentence longer than a passage
            if current:
                passages.append(current)
                current = []
            passages.append(tokens[:words])
            tokens = tokens[words:]
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


_LOADERS = {"papers": _papers, "lee": _lee, "wiki": _wiki, "pydoc": _pydoc}


def _path_documents(path):
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise ConfigError("corpus", f"folder {path} holds no .txt files")
        for file in files:
            yield from _path_documents(file)
        return
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError("corpus", f"{path}:{k + 1}: not JSON ({e.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ConfigError("corpus", f'{path}:{k + 1}: expected an object with a '
                                      '"text" string')
                yield record["text"], f"{path.name}#{k}"
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("corpus", f"file {path} is not UTF-8 text") from None
    for k, block in enumerate(re.split(r"\n\s*\n", text)):
        if block.strip():
            yield block, f"{path.name}#{k}"


def load(spec, words=80, min_words=8, limit=None):
    """Passages of the corpus ``spec`` (see the module docstring), at most ``limit``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("corpus", "give a name (" + ", ".join(CORPORA + ("all",)) +
                         ") or a path")
    if limit is not None and limit < 1:
        raise ConfigError("limit", "must be at least 1", value=limit)
    parts = []
    for part in spec.split("+"):
        if part == "all":
            parts += list(CORPORA)
        else:
            parts.append(part)
    passages, seen = [], set()
    for part in parts:
        if part in _LOADERS:
            documents = _LOADERS[part]()
        elif Path(part).exists():
            documents = _path_documents(part)
        else:
            raise ConfigError("corpus", f"{part!r} is neither a known corpus (" +
                             ", ".join(CORPORA + ("all",)) + ") nor an existing path")
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
    for name in sys.argv[1:] or CORPORA:
        found = load(name)
        print(name, len(found), sum(len(p.text.split()) for p in found))
