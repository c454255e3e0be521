"""``hwgen dataset ralm-keys``: SmolLM2's kNN-LM keys as a retrieval data set. The keys are the
model's own hidden states, the ground truth matches a brute-force numpy search, held-out
documents stay out of the base, and a finished or interrupted build is reused."""

import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="the ralm LM needs torch")

from hwgen.errors import ConfigError  # noqa: E402
from hwgen.espn.host.corpus import Passage  # noqa: E402
from hwgen.ralm import keys  # noqa: E402
from test_ralm_lm import smollm2  # noqa: E402,F401  (the fixture)

pytest.importorskip("faiss", reason="the ground truth needs faiss-cpu")


def test_documents_are_held_out_whole():
    ps = [Passage(f"text {d} {i}", f"wiki/Doc{d}/{i}") for d in range(25) for i in range(3)]
    base, held = keys.split_documents(ps, every=10)
    held_docs = {keys.document_of(p.source) for p in held}
    assert held_docs == {"wiki/Doc9", "wiki/Doc19"}
    assert not held_docs & {keys.document_of(p.source) for p in base}
    assert len(base) + len(held) == len(ps)


@pytest.fixture(scope="module")
def built(smollm2, tmp_path_factory):  # noqa: F811
    model, _ = smollm2
    out = tmp_path_factory.mktemp("keys")
    lines = []
    meta = keys.build_ralm_keys(out, 300, corpus="lee", queries=20, gt_k=5, model=model,
                                log=lines.append)
    return model, out, meta, lines


def test_keys_are_the_models_hidden_states(built):
    """The first passage's keys are SmolLM2's states before the LM head, its values the next
    tokens; the int8 copy is the one-scale saturating quantisation."""
    from hwgen.espn.host.corpus import load
    model, out, meta, _ = built
    base, values = np.load(out / "base.npy"), np.load(out / "values.npy")
    assert base.shape == (300, 576) and base.dtype == np.float32 and meta["tokens"] == 300
    first, _ = keys.split_documents(load("lee"))
    ids = model.tokenizer.encode(first[0].text)
    _, hidden = model.forward(ids, logits=False)
    n = min(len(ids) - 1, 300)
    np.testing.assert_array_equal(base[:n], np.asarray(hidden[:-1], np.float32)[:n])
    np.testing.assert_array_equal(values[:n], ids[1:n + 1])
    ints = np.load(out / "base_int8.npy")
    want = np.clip(np.round(base.astype(np.float64) * meta["int8_inv_scale"]), -128, 127)
    np.testing.assert_array_equal(ints, want.astype(np.int8))
    assert meta["mix"] == {"lee": 300}


def test_ground_truth_is_exact(built):
    """gt.npy against a brute-force float64 search in numpy (ties aside: distances equal)."""
    _, out, meta, _ = built
    base, queries, gt = (np.load(out / f"{n}.npy") for n in ("base", "queries", "gt"))
    assert queries.shape == (20, 576) and gt.shape == (20, 5)
    d = ((queries[:, None, :].astype(np.float64) - base[None, :, :]) ** 2).sum(-1)
    want = np.sort(d, axis=1)[:, :5]
    got = np.take_along_axis(d, gt, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # held-out queries are not copies of base keys
    assert want[:, 0].min() > 0


def test_finished_build_is_reused_and_interrupted_one_resumes(built):
    model, out, meta, _ = built
    lines = []
    again = keys.build_ralm_keys(out, 300, corpus="lee", queries=20, gt_k=5,
                                 model=object(), log=lines.append)   # would fail if used
    assert again == meta and "cached" in lines[0]
    before = np.load(out / "base.npy")
    (out / "meta.json").unlink()
    parts = sorted((out / "parts").glob("part-*.npz"))
    assert parts
    resumed = keys.build_ralm_keys(out, 300, corpus="lee", queries=20, gt_k=5, model=model)
    np.testing.assert_array_equal(np.load(out / "base.npy"), before)
    assert resumed["tokens"] == 300
    assert json.loads((out / "meta.json").read_text())["params"]["tokens"] == 300


@pytest.mark.parametrize("kwargs, name", [({"tokens": 1}, "tokens"), ({"queries": 0}, "queries"),
                                          ({"tokens": 10, "gt_k": 11}, "k")])
def test_bad_sizes_name_the_parameter(kwargs, name, tmp_path):
    args = {"tokens": 100, **kwargs}
    tokens = args.pop("tokens")
    with pytest.raises(ConfigError) as e:
        keys.build_ralm_keys(tmp_path, tokens, model=object(), **args)
    assert e.value.param == name
