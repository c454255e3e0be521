"""Fuzzing of user input (hypothesis): every generated ``--set`` value, ``--config`` file,
cluster description and ``.npy`` file gets a clean :class:`~hwgen.errors.ConfigError` naming a
parameter, or a valid result. Never another exception (which the CLI would show as an internal
error), never a hang. Examples are bounded so the file runs in well under a minute.

The raw-socket fuzzing of the node server is in ``tests/test_node_server.py``.
"""

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hwgen import registry
from hwgen.cluster.run import builder
from hwgen.cluster.spec import describe
from hwgen.errors import ConfigError

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
set_texts = st.one_of(st.text(max_size=12),
                      st.sampled_from(["08", "0x10", "0o7", "1e3", "1_000", " 16", "-1", "nan",
                                       "inf", "true", "9" * 5000, "16.0", "", "="]),
                      st.integers(-2**40, 2**40).map(str))


def _accept_or_config_error(fn):
    """Run ``fn``; a ConfigError is a clean refusal, any other exception fails the test."""
    try:
        return fn()
    except ConfigError as e:
        assert e.param and str(e).strip() and "\n" not in str(e), str(e)
        return None


@FUZZ
@given(name=st.sampled_from(registry.names()), data=st.data())
def test_set_values_are_parsed_or_refused(name, data):
    acc = registry.get(name)
    fields = [f[0] for f in acc.config.describe()]
    key = data.draw(st.one_of(st.sampled_from(fields), st.text(max_size=6)))
    value = data.draw(set_texts)
    cfg = _accept_or_config_error(lambda: acc.make_config([f"{key}={value}"]))
    if cfg is not None:
        # accepted: the value round-trips (no silent reinterpretation) and re-validates
        parsed = getattr(cfg, key)
        assert acc.config.from_dict(cfg.to_dict()) == cfg
        if isinstance(parsed, int) and not isinstance(parsed, bool):
            assert int(value.strip(), 10) == parsed


@FUZZ
@given(name=st.sampled_from(registry.names()), data=st.data())
def test_config_files_are_read_or_refused(tmp_path_factory, name, data):
    acc = registry.get(name)
    fields = [f[0] for f in acc.config.describe()]
    keys = st.one_of(st.sampled_from(fields), st.text(max_size=6))
    doc = data.draw(st.one_of(json_values, st.dictionaries(keys, json_values, max_size=3)))
    path = tmp_path_factory.mktemp("cfg") / "c.json"
    kind = data.draw(st.sampled_from(["json", "bytes", "deep"]))
    if kind == "json":
        path.write_text(json.dumps(doc))
    elif kind == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=64)))
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)
    cfg = _accept_or_config_error(lambda: acc.make_config([], str(path)))
    if cfg is not None:
        assert isinstance(doc, dict) and set(doc) <= set(fields)


def _paths(obj, prefix=()):
    """Every (path, value) inside a JSON document."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@pytest.fixture(scope="module")
def shipped():
    path = describe.DESCRIPTIONS_DIR / "ibert_encoder.json"
    doc = json.loads(path.read_text())
    doc["layers"] = json.loads((describe.DESCRIPTIONS_DIR / doc["layers"]).read_text())
    return doc


@FUZZ
@given(data=st.data())
def test_cluster_descriptions_are_planned_or_refused(shipped, data):
    doc = copy.deepcopy(shipped)
    for _ in range(data.draw(st.integers(1, 3))):
        places = list(_paths(doc))
        where, _ = data.draw(st.sampled_from(places[1:]))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, (dict, list)):
            parent[where[-1]] = data.draw(json_values)
        elif isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent.pop(where[-1])
    desc = _accept_or_config_error(lambda: describe.parse(doc))
    if desc is not None:
        _accept_or_config_error(lambda: builder.plan(desc))


npy_dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int64, np.uint8,
                              np.bool_, np.complex64, "U3", "V4", object])


@FUZZ
@given(dtype=npy_dtypes, shape=st.lists(st.integers(0, 6), max_size=3),
       special=st.sampled_from([None, np.nan, np.inf, 1e300]), data=st.data())
def test_npy_vector_files_are_loaded_or_refused(tmp_path_factory, dtype, shape, special, data):
    from hwgen.vecsearch.node_model import load_vectors
    path = tmp_path_factory.mktemp("npy") / "v.npy"
    kind = data.draw(st.sampled_from(["array", "garbage", "empty-file"]))
    if kind == "array":
        x = np.zeros(shape, dtype=dtype)
        if special is not None and x.size and x.dtype.kind == "f":
            x.flat[0] = special
        np.save(path, x, allow_pickle=True)
    elif kind == "garbage":
        path.write_bytes(data.draw(st.binary(max_size=200)))
    else:
        path.write_bytes(b"")
    x = _accept_or_config_error(lambda: load_vectors(str(path), "base"))
    if x is not None:
        assert x.ndim == 2 and x.shape[0] >= 1 and x.shape[1] >= 1
        assert x.dtype == (np.int64 if np.dtype(dtype).kind in "iu" else np.float32)
        assert np.isfinite(x).all()


@FUZZ
@given(data=st.data())
def test_recommendation_model_files_are_read_or_refused(data):
    from hwgen.recsys.model import RecModel, small_ctr
    doc = small_ctr().to_dict()
    key = data.draw(st.sampled_from(sorted(doc) + ["extra"]))
    doc[key] = data.draw(json_values)
    if data.draw(st.booleans()):
        doc = data.draw(json_values)
    model = _accept_or_config_error(lambda: RecModel.from_dict(doc))
    if model is not None:
        assert model.layer_shapes and all(t.rows >= 1 and t.dim >= 1 for t in model.tables)


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(registry.names()), data=st.data())
def test_cli_gives_a_result_or_one_clean_line(tmp_path_factory, name, data):
    """The whole CLI path (`hwgen config`, which validates without building): exit 0 with the
    configuration echoed as JSON, or exit 2 with one line; never a traceback or exit 3."""
    from click.testing import CliRunner
    from hwgen.cli import main
    acc = registry.get(name)
    fields = [f[0] for f in acc.config.describe()]
    args = ["config", name]
    for _ in range(data.draw(st.integers(0, 3))):
        key = data.draw(st.one_of(st.sampled_from(fields), st.text(max_size=5)))
        args += ["--set", f"{key}={data.draw(set_texts)}"]
    if data.draw(st.booleans()):
        path = tmp_path_factory.mktemp("cli") / "c.json"
        path.write_text(json.dumps(data.draw(st.dictionaries(
            st.one_of(st.sampled_from(fields), st.text(max_size=5)), json_values, max_size=3))))
        args += ["--config", str(path)]
    if data.draw(st.booleans()):
        args += ["--board", data.draw(st.sampled_from(["u280", "u55c", "vck190", "nope", ""]))]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 2), (args, result.stderr, result.exception)
    if result.exit_code == 0:
        echoed = json.loads(result.stdout)
        assert acc.config.from_dict(echoed["config"]).to_dict() == echoed["config"]
    else:
        assert result.stderr.startswith("hwgen: error: ") and result.stderr.count("\n") == 1


_SWEEP_KEYS = ["accelerator", "grid", "configs", "seeds", "stall", "items", "engine", "options",
               "synth", "timing", "fault", "comment", "colour"]


@FUZZ
@given(data=st.data())
def test_sweep_specs_are_loaded_or_refused(data):
    """Issue 35 deliver 4: a generated sweep spec (known and unknown keys, real accelerators
    and parameters with any JSON values, grids up to 10^9 points) is either a job list within
    ``max_jobs`` or one clean ConfigError; nothing else, and no product is built past the
    cap."""
    from hwgen.flow.sweep import load_spec
    name = data.draw(st.sampled_from(registry.names()))
    fields = [f[0] for f in registry.get(name).config.describe()]
    entry = data.draw(st.dictionaries(st.sampled_from(_SWEEP_KEYS), json_values, max_size=5))
    if data.draw(st.booleans()):
        entry["accelerator"] = name
    if data.draw(st.booleans()):
        entry["grid"] = data.draw(st.dictionaries(
            st.one_of(st.sampled_from(fields), st.text(max_size=5)),
            st.one_of(st.lists(json_scalars, max_size=3),
                      st.integers(1, 1000).map(lambda n: list(range(n)))), max_size=3))
    spec = [entry] if data.draw(st.booleans()) else entry
    jobs = _accept_or_config_error(lambda: load_spec(spec if isinstance(spec, list) else [spec],
                                                     max_jobs=500))
    assert jobs is None or 1 <= len(jobs) <= 500
