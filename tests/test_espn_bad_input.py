"""Issue 35's ESPN items (7, 8, 13, 15, 16) and ChamLM's item 21 as regressions: one line on
stderr naming the option or file, exit status 2, no traceback, and the refusal comes before the
MiniLM encoder (or the LM) is created. The passage splitter is linear in the words.

The index used here is built with a stand-in encoder (random unit vectors): the refusals do
not depend on what the embeddings mean, and no model is loaded.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

faiss = pytest.importorskip("faiss")

from hwgen.cli import espn as espn_cli  # noqa: E402
from hwgen.cli import main  # noqa: E402
from hwgen.errors import ConfigError  # noqa: E402
from hwgen.espn.host import corpus, encoder, index as index_mod, search, store  # noqa: E402

DIM = 16
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon").split()


class StandIn:
    """What :func:`index_mod.build` needs of an encoder, without a model."""

    def __init__(self, dim=DIM):
        self.dim = dim
        self.mean = np.zeros(encoder.DIM, np.float32)
        self.components = np.eye(encoder.DIM, dim, dtype=np.float32)

    def fit(self, texts):
        pass

    def encode(self, texts):
        rng = np.random.default_rng(len(texts))
        pooled = rng.standard_normal((len(texts), encoder.DIM)).astype(np.float32)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        tokens = []
        for t in texts:
            x = rng.standard_normal((len(t.split()), self.dim)).astype(np.float32)
            tokens.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16))
        return pooled, tokens


def _no_model(*args, **kwargs):
    raise AssertionError("the encoder's model was loaded before the refusal")


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    """Any test here that creates the MiniLM encoder fails (exit 3 through the CLI)."""
    monkeypatch.setattr(index_mod, "TokenEncoder", _no_model)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("espn-corpus") / "c.txt"
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=20)) + "." for _ in range(40)))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus_file):
    folder = tmp_path_factory.mktemp("espn-stand-in") / "idx"
    index_mod.build(str(corpus_file), folder, dim=DIM, quiet=True, encoder=StandIn())
    return folder


@pytest.fixture
def damaged(built, tmp_path):
    """A fresh copy of the index to damage."""
    folder = tmp_path / "idx"
    shutil.copytree(built, folder)
    return folder


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr


def one_line(code, err, *needles):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("hwgen: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def hwgen_process(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "hwgen.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# --- item 7: input file types and sizes, the splitter ------------------------------------

def test_dev_zero_is_refused_by_type(tmp_path):
    run = hwgen_process("espn", "index", "/dev/zero", "--out", tmp_path / "o", timeout=60)
    one_line(run.returncode, run.stderr, "/dev/zero")


def test_fifo_in_a_folder_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("a passage of enough words to be kept by the splitter here.")
    os.mkfifo(folder / "b.txt")
    run = hwgen_process("espn", "index", folder, "--out", tmp_path / "o", timeout=60)
    one_line(run.returncode, run.stderr, "b.txt", "not a regular file")


def test_proc_files_are_refused_naming_the_file(tmp_path):
    code, err = cli("espn", "index", "/proc/self/mem", "--out", tmp_path / "o")
    one_line(code, err, "/proc/self/mem", "pseudo file system")


def test_oversized_corpus_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:            # sparse: no disk used, nothing worth reading
        f.truncate(corpus.MAX_CORPUS_BYTES + 1)
    code, err = cli("espn", "index", big, "--out", tmp_path / "o")
    one_line(code, err, "big.txt", f"{corpus.MAX_CORPUS_BYTES:,}")
    # two files under the cap each but over it together
    half = tmp_path / "half.txt"
    with open(half, "wb") as f:
        f.truncate(corpus.MAX_CORPUS_BYTES // 2 + 1)
    with pytest.raises(ConfigError, match="limited to"):
        corpus.check(f"{half}+{half}")


def test_corpus_of_regular_files_still_loads(corpus_file):
    passages = corpus.load(str(corpus_file))
    assert len(passages) == 40 and all(len(p.text.split()) == 20 for p in passages)
    jsonl = corpus_file.with_suffix(".jsonl")
    jsonl.write_text("\n".join(json.dumps({"text": p.text}) for p in passages[:5]))
    assert [p.text for p in corpus.load(str(jsonl))] == [p.text for p in passages[:5]]
    odd = "a line separator \u2028 and a paragraph separator \u2029 inside one passage text"
    jsonl.write_text(json.dumps({"text": odd}, ensure_ascii=False) + "\n")
    assert [p.text for p in corpus.load(str(jsonl))] == [" ".join(odd.split())]


def _reference_split(text, words=80, min_words=8):
    """The splitter as first written (quadratic in a long sentence, correct)."""
    passages, current = [], []
    for sentence in corpus._SENTENCE_END.split(" ".join(text.split())):
        tokens = sentence.split()
        while len(tokens) > words:
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


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(WORDS[:5] + ["end.", "why?", "so!", "\n", "  "]),
                max_size=120),
       st.integers(1, 12), st.integers(1, 6))
def test_splitter_equals_the_reference(tokens, words, min_words):
    text = " ".join(tokens)
    assert corpus.split_passages(text, words, min_words) == _reference_split(
        text, words, min_words)


def test_splitter_is_linear_on_one_long_line():
    """8 MiB without sentence punctuation: about 1 s linear, minutes quadratic."""
    code = ("import time; from hwgen.espn.host.corpus import split_passages as s\n"
            "t = 'lorem ipsum dolor sit amet ' * (8 * 2**20 // 27 // 16 * 16)\n"
            "p = s(t, 80, 8); assert len(p) == len(t.split()) // 80, len(p)\n"
            "assert set(map(len, map(str.split, p))) == {80}\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


# --- items 8 and 16: candidates and copies are capped -----------------------------------

def test_candidates_cap_before_loading_anything(built):
    code, err = cli("espn", "query", built, "vector search", "--candidates", 10**9)
    one_line(code, err, "candidates", f"{search.MAX_CANDIDATES}")
    code, err = cli("espn", "bench", built, "--candidates", 10**9)
    one_line(code, err, "candidates", f"{search.MAX_CANDIDATES}")


def test_searcher_caps_candidates_at_the_documents(built):
    index = index_mod.Index(built)
    with store.RamStore(index.tokens_path, index.offsets, index.ntokens, DIM) as ram:
        with pytest.raises(ConfigError, match="candidates"):
            search.Searcher(index, ram, nprobe=1, candidates=10**9)
        s = search.Searcher(index, ram, nprobe=1, candidates=search.MAX_CANDIDATES, k=5)
        assert s.candidates == index.meta["documents"] == 40
        q = search.Query(np.eye(1, encoder.DIM, dtype=np.float32)[0],
                         np.eye(3, DIM, dtype=np.float16))
        wide = s.search(q)
        exact = search.Searcher(index, ram, nprobe=1, candidates=40, k=5).search(q)
        assert np.array_equal(wide.ids, exact.ids) and len(wide.candidates) == 40


def test_copies_cap_before_the_model(corpus_file, tmp_path, monkeypatch):
    code, err = cli("espn", "index", corpus_file, "--out", tmp_path / "o",
                    "--copies", 10**12)
    one_line(code, err, "copies", f"{index_mod.MAX_COPIES}")
    assert "--items" not in err
    monkeypatch.setattr(index_mod, "MAX_DOCUMENTS", 100)      # 40 passages x 3 copies
    code, err = cli("espn", "index", corpus_file, "--out", tmp_path / "o", "--copies", 3)
    one_line(code, err, "copies", "120 documents")


def test_help_states_the_caps_and_they_agree_with_the_library():
    assert espn_cli.MAX_COPIES == index_mod.MAX_COPIES
    assert espn_cli.MAX_DOCUMENTS == index_mod.MAX_DOCUMENTS
    assert espn_cli.MAX_CANDIDATES == search.MAX_CANDIDATES
    assert espn_cli.CANDIDATES == search.CANDIDATES
    assert espn_cli.MAX_CORPUS_MIB << 20 == corpus.MAX_CORPUS_BYTES
    assert espn_cli.DIMS == encoder.DIMS
    help_index = CliRunner().invoke(main, ["espn", "index", "--help"]).output
    assert "1..1,000" in help_index and "64 MiB" in help_index and "FIFOs" in help_index
    for command in ("query", "bench"):
        text = CliRunner().invoke(main, ["espn", command, "--help"]).output
        assert "1..100,000" in text, command


# --- items 13 and 15: a damaged index names its file, before the model -------------------

def test_meta_json_that_is_not_an_object(damaged):
    (damaged / "meta.json").write_text("[]")
    for command in ("query", "bench"):
        args = ("espn", command, damaged) + (("vector search",) if command == "query" else ())
        one_line(*cli(*args), "meta.json", "expected a JSON object")


@pytest.mark.parametrize("field,value", [("dim", "x"), ("passages", "40"),
                                         ("file_bytes", -1)])
def test_meta_json_with_bad_fields(damaged, field, value):
    meta = json.loads((damaged / "meta.json").read_text())
    meta[field] = value
    (damaged / "meta.json").write_text(json.dumps(meta))
    one_line(*cli("espn", "query", damaged, "text"), "meta.json", field)


@pytest.mark.parametrize("garbage", ["not json\n", "[1, 2]\n", '{"text": 3}\n', ""])
def test_garbage_passages_file(damaged, garbage):
    (damaged / "passages.jsonl").write_text(garbage)
    one_line(*cli("espn", "query", damaged, "vector search"), "passages.jsonl")
    one_line(*cli("espn", "bench", damaged, "--candidates", 10), "passages.jsonl")


@pytest.mark.parametrize("name", ["table.npz", "projection.npz", "ivf.faiss", "tokens.bin"])
@pytest.mark.parametrize("damage", ["garbage", "missing", "folder"])
def test_damaged_index_files_are_named(damaged, name, damage):
    path = damaged / name
    path.unlink()
    if damage == "garbage":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    elif damage == "folder":
        path.mkdir()
    line = one_line(*cli("espn", "query", damaged, "vector search"), name)
    assert str(damaged) in line and "rebuild the index" in line


def test_budgets_must_be_finite(built):
    one_line(*cli("espn", "bench", built, "--budgets", "0.5,inf"), "budgets", "finite")


def test_passages_file_that_is_a_fifo(damaged):
    (damaged / "passages.jsonl").unlink()
    os.mkfifo(damaged / "passages.jsonl")
    run = hwgen_process("espn", "query", damaged, "vector search", timeout=60)
    one_line(run.returncode, run.stderr, "passages.jsonl", "regular file")


def test_truncated_token_file_names_the_file_and_the_index(damaged):
    meta = json.loads((damaged / "meta.json").read_text())
    meta["file_bytes"] -= store.BLOCK
    (damaged / "meta.json").write_text(json.dumps(meta))
    os.truncate(damaged / "tokens.bin", meta["file_bytes"])
    line = one_line(*cli("espn", "query", damaged, "vector search"), "tokens.bin")
    assert str(damaged) in line and "rebuild the index" in line


def test_short_read_names_the_file_and_the_index(damaged):
    index = index_mod.Index(damaged)
    try:
        reader = store.DirectStore(index.tokens_path, index.offsets, index.ntokens, DIM)
    except Exception as e:                       # tmpfs: no O_DIRECT
        pytest.skip(f"no O_DIRECT here: {e}")
    with reader:
        os.truncate(index.tokens_path, int(index.offsets[-1]))
        with pytest.raises(ConfigError) as raised:
            reader.read([len(index.offsets) - 1])
    text = str(raised.value)
    assert "tokens.bin" in text and str(damaged) in text and "short read" in text


# --- item 21: ChamLM's --corpus is checked before the LM loads ------------------------------

@pytest.mark.parametrize("bad", ["no-such-corpus", "/dev/zero", "/proc/self/mem"])
def test_ralm_corpus_before_the_lm(bad, monkeypatch):
    lm = pytest.importorskip("hwgen.ralm.lm")
    monkeypatch.setattr(lm, "load", _no_model)
    one_line(*cli("ralm", "generate", "the", "--corpus", bad), "corpus")
