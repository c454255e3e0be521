"""Recommendation model descriptions (the paper's Fig. 1: embedding tables, dense features, FC
layers), JSON round trip and the named presets.

A model looks up one row in each embedding table per inference, concatenates the rows (in table
order) with the dense features, and runs fully-connected layers: ReLU between layers, the last
layer plain. Everything is integer: table elements and dense features are signed
``act_bits[0]``-bit integers, layer ``l`` has signed ``weight_bits``-bit weights, 32-bit biases,
and its output is requantised to ``act_bits[l + 1]`` bits (arithmetic shift right by
``shifts[l]``, round half to even, clamp) before the next layer; the last layer's output is the
32-bit accumulator.
"""

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ConfigError

__all__ = ["Table", "RecModel", "PRESETS", "preset", "paper_ctr", "small_ctr", "cluster_ctr"]


@dataclass(frozen=True)
class Table:
    """One embedding table: ``rows`` vectors of ``dim`` elements."""
    rows: int
    dim: int

    def bytes(self, elem_bits):
        """Bytes of the table's contents at ``elem_bits`` bits per element (no row padding)."""
        return self.rows * self.dim * elem_bits // 8


@dataclass(frozen=True)
class RecModel:
    """A click-through-rate model (see module docstring).

    Attributes
    ----------
    name : str
    tables : tuple of Table
    dense : int
        Dense features appended after the embedding vectors.
    layers : tuple of int
        Output sizes of the FC layers, in order (the input size of the first is the
        concatenated length).
    weight_bits : int
        Bits of a weight (8 or 16).
    act_bits : tuple of int
        Bits of the activations entering each layer (table elements and dense features are
        ``act_bits[0]``); one entry per layer.
    shifts : tuple of int
        Requantisation shift after each layer but the last.
    seed : int
        Seed of the reproducible random contents (tables, weights, biases) used by simulations.
    note : str
        Where the figures come from.
    """
    name: str
    tables: tuple
    dense: int
    layers: tuple
    weight_bits: int = 8
    act_bits: tuple = ()
    shifts: tuple = ()
    seed: int = 1
    note: str = ""

    def __post_init__(self):
        if not self.tables:
            raise ConfigError("tables", "a model needs at least one embedding table")
        for i, t in enumerate(self.tables):
            if t.rows < 1 or t.dim < 1:
                raise ConfigError(f"tables[{i}]", "rows and dim must be at least 1",
                                  value=(t.rows, t.dim))
        if self.dense < 0:
            raise ConfigError("dense", "must be >= 0", value=self.dense)
        if not self.layers or min(self.layers) < 1:
            raise ConfigError("layers", "needs at least one layer, each of size >= 1",
                              value=self.layers)
        if self.weight_bits not in (8, 16):
            raise ConfigError("weight_bits", "must be 8 or 16", value=self.weight_bits)
        if len(self.act_bits) != len(self.layers) or any(b not in (8, 16)
                                                         for b in self.act_bits):
            raise ConfigError("act_bits", f"needs {len(self.layers)} entries of 8 or 16",
                              value=self.act_bits)
        if len(self.shifts) != len(self.layers) - 1 or any(s < 0 or s > 40 for s in self.shifts):
            raise ConfigError("shifts", f"needs {len(self.layers) - 1} entries in 0..40",
                              value=self.shifts)

    @property
    def elem_bits(self):
        """Bits of a table element and of a dense feature: ``act_bits[0]``."""
        return self.act_bits[0]

    @property
    def concat_len(self):
        """Length of the first layer's input: the tables' dimensions plus the dense features."""
        return sum(t.dim for t in self.tables) + self.dense

    @property
    def layer_shapes(self):
        """(in, out) of every FC layer."""
        sizes = (self.concat_len,) + tuple(self.layers)
        return list(zip(sizes[:-1], sizes[1:]))

    @property
    def table_bytes(self):
        """Bytes of all the tables' contents (no row padding)."""
        return sum(t.bytes(self.elem_bits) for t in self.tables)

    def to_dict(self):
        """JSON form: the fields, ``tables`` as ``[[rows, dim], ...]``."""
        d = asdict(self)
        d["tables"] = [[t.rows, t.dim] for t in self.tables]
        return d

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; a :class:`~hwgen.errors.ConfigError` names an unknown,
        missing or mistyped field."""
        if not isinstance(d, dict):
            raise ConfigError("model", "must be a JSON object of model fields")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], "unknown model field; known: "
                              + ", ".join(sorted(known)))
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        d = dict(d)
        for key in ("name", "tables", "dense", "layers"):
            if key not in d:
                raise ConfigError(key, "missing from the model description")
        tables = d["tables"]
        if not isinstance(tables, (list, tuple)) or not all(
                isinstance(t, (list, tuple)) and len(t) == 2 and all(map(is_int, t))
                for t in tables):
            raise ConfigError("tables", "must be a list of [rows, dim] integer pairs")
        d["tables"] = tuple(Table(r, dm) for r, dm in tables)
        for key in ("layers", "act_bits", "shifts"):
            if key in d:
                if not isinstance(d[key], (list, tuple)) or not all(map(is_int, d[key])):
                    raise ConfigError(key, "must be a list of integers", value=d[key])
                d[key] = tuple(d[key])
        for key in ("dense", "weight_bits", "seed"):
            if key in d and not is_int(d[key]):
                raise ConfigError(key, "must be an integer", value=d[key])
        for key in ("name", "note"):
            if key in d and not isinstance(d[key], str):
                raise ConfigError(key, "must be a string", value=d[key])
        return cls(**d)

    @classmethod
    def from_json(cls, path):
        """The model described by the JSON file ``path`` (:meth:`from_dict`)."""
        from ..checks import read_json
        return cls.from_dict(read_json(path, "model"))

    def to_json(self, path):
        """Write :meth:`to_dict` to the JSON file ``path``."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)


def paper_ctr():
    """The paper's production model (Table I): 98 tables, concatenated length 876, hidden layers
    1024/512/256 and a 1-wide output, 15.1 GB of tables.

    The paper publishes neither the table sizes nor their widths nor its number formats, only
    that sizes range "from KBs to GBs". Assumed here: 16-bit elements, every table 8 wide (784
    embedding elements, so 92 dense features make 876), and row counts spread geometrically
    from 64 rows (1 KB) to about 132 million (2.1 GB), scaled so that the tables total
    15.1 GB; 16-bit weights and activations.
    """
    n, dim, elem_bytes = 98, 8, 2
    ratios = np.geomspace(1.0, 2.2e6, n)
    total = 15.1e9 / (dim * elem_bytes)
    rows = np.maximum(64, np.round(ratios * total / ratios.sum())).astype(int)
    return RecModel(
        name="paper-ctr", tables=tuple(Table(int(r), dim) for r in rows), dense=876 - n * dim,
        layers=(1024, 512, 256, 1), weight_bits=16, act_bits=(16, 16, 16, 16),
        shifts=(12, 12, 12), seed=1,
        note="Zhu et al., Distributed Recommendation Inference on FPGA Clusters, Table I; "
             "table sizes and number formats assumed (geometric, 1 KB .. 2.1 GB, 15.1 GB in "
             "total; 16-bit)")


def small_ctr():
    """A small model for simulations: 13 tables of odd sizes (one of a single row), 5 dense
    features, layers 48/24/1."""
    dims = (4, 8, 3, 8, 5, 8, 4, 6, 8, 2, 8, 7, 4)
    rows = (1, 17, 300, 1000, 64, 5000, 3, 250, 70000, 9, 4096, 123, 60000)
    return RecModel(name="small-ctr", tables=tuple(Table(r, d) for r, d in zip(rows, dims)),
                    dense=5, layers=(48, 24, 1), weight_bits=8, act_bits=(8, 8, 8),
                    shifts=(9, 9), seed=7,
                    note="hwgen test model: odd table sizes, a single-row table")


def cluster_ctr():
    """A model small enough to simulate split over 2 or 4 nodes (``hwgen recsys-cluster-sim``):
    6 tables of odd dimensions (one of a single row), 5 dense features (concatenated length
    35), hidden layers 29/13/7 and a 1-wide output, 8-bit throughout. Its layer work
    35x29 : 29x13 : 13x7 rounds to the paper's 8:4:1."""
    dims = (3, 7, 5, 2, 9, 4)
    rows = (1, 37, 300, 1000, 20, 4096)
    return RecModel(name="cluster-ctr", tables=tuple(Table(r, d) for r, d in zip(rows, dims)),
                    dense=5, layers=(29, 13, 7, 1), weight_bits=8, act_bits=(8, 8, 8, 8),
                    shifts=(9, 8, 8), seed=5,
                    note="hwgen multi-node simulation model: odd sizes, work ratios 8:4:1")


PRESETS = {"paper-ctr": paper_ctr, "small-ctr": small_ctr, "cluster-ctr": cluster_ctr}


def preset(name):
    """A fresh :class:`RecModel` of preset ``name`` (a key of :data:`PRESETS`); ConfigError naming
    the choices otherwise."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError("preset", "unknown; choose one of: " + ", ".join(PRESETS),
                          value=name) from None
