"""One node of a multi-FPGA recommendation cluster: the node's generated top.

A node holds, from the partitioner's plan (:mod:`hwgen.recsys.multinode`), a contiguous slice of
output rows of some FC layers, one :class:`~hwgen.recsys.fc.FC` instance per slice, and on node 1
the embedding lookup unit (:class:`~hwgen.recsys.embedding.Embedding`). Every block keeps its own
stream ports at the node's boundary: the streams between nodes go through the network (in
simulation, :mod:`hwgen.recsys.multinode`'s network model), so a slice's input is the whole
input vector of its layer, wherever it was produced.

:class:`SliceConfig` is an FC configuration whose weights are rows ``row_start .. row_start +
out_dim - 1`` of the model's layer (:func:`hwgen.recsys.golden.layer_params`), so the slices of
a layer put together in row order compute exactly that layer.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..boards import board_names
from ..config import Config, Record, param
from ..errors import ConfigError
from ..flow.model import StreamModel
from ..lib.axi import AXI4Signature
from . import golden
from .embedding import ADDR_BITS, Embedding, EmbeddingConfig, EmbeddingModel
from .fc import FC, FCConfig, FCModel, input_layout, output_layout
from .model import PRESETS, preset

__all__ = ["SliceConfig", "ModelEmbeddingConfig", "NodeConfig", "NodeTop", "NodeModel",
           "Slice", "parse_slices", "format_slices"]


@dataclass(frozen=True)
class SliceConfig(FCConfig):
    """An FC layer *slice*: output rows ``row_start .. row_start + out_dim - 1`` of a layer of
    ``layer_rows`` rows whose weights and biases are :func:`hwgen.recsys.golden.layer_params`
    of a model with seed ``weight_seed`` (drawn with ``default_rng([weight_seed, layer])``
    for the whole layer, then the slice's rows taken), so slices computed on different nodes
    and gathered in row order equal the whole layer."""
    layer: int = param(0, "index of the layer in its model (0-based)", lo=0, hi=63)
    layer_rows: int = param(0, "rows of the whole layer's W (0: out_dim, the whole layer)",
                            lo=0, hi=4096)
    row_start: int = param(0, "first row of the whole layer computed here", lo=0, hi=4095)

    def check(self):
        super().check()
        rows = self.layer_rows or self.out_dim
        if self.row_start + self.out_dim > rows:
            raise ConfigError("row_start", f"rows row_start .. row_start + out_dim - 1 = "
                              f"{self.row_start} .. {self.row_start + self.out_dim - 1} must lie "
                              f"within the layer's {rows} rows", value=self.row_start)

    @cached_property
    def parameters(self):
        """``(W, b)`` of the slice: rows ``row_start .. row_start + out_dim - 1`` of the whole
        layer's :func:`hwgen.recsys.golden.fc_params` drawn with ``default_rng([weight_seed,
        layer])``."""
        rows = self.layer_rows or self.out_dim
        rng = np.random.default_rng([self.weight_seed, self.layer])
        w, b = golden.fc_params(self.in_dim, rows, self.weight_bits, self.act_bits, rng)
        end = self.row_start + self.out_dim
        return w[self.row_start:end], b[self.row_start:end]


@dataclass(frozen=True)
class ModelEmbeddingConfig(EmbeddingConfig):
    """The embedding lookup unit of a named model preset (its tables and seed) instead of the
    synthetic model. ``tables``, ``dense``, ``elem_bits`` and ``rows_max`` must be the model's
    (table count, dense features, element bits, largest table's rows: they size the ports);
    ``dim_min``, ``dim_max`` and ``model_seed`` are not used."""
    preset: str = param("cluster-ctr", "model preset whose tables are looked up",
                        choices=tuple(PRESETS))

    @cached_property
    def rec_model(self):
        """The preset's :class:`~hwgen.recsys.model.RecModel` (instead of the synthetic model)."""
        return preset(self.preset)

    @classmethod
    def of_model(cls, name, **values):
        """The configuration of preset ``name`` with its model's sizes filled in."""
        model = preset(name)
        return cls(preset=name, tables=len(model.tables), dense=model.dense,
                   elem_bits=model.elem_bits, rows_max=max(t.rows for t in model.tables),
                   **values)

    def check(self):
        model = self.rec_model
        for name, want in (("tables", len(model.tables)), ("dense", model.dense),
                           ("elem_bits", model.elem_bits),
                           ("rows_max", max(t.rows for t in model.tables))):
            if getattr(self, name) != want:
                raise ConfigError(name, f"must be the {self.preset} model's {want}",
                                  value=getattr(self, name))
        super().check()


@dataclass(frozen=True)
class Slice(Record):
    """One FC layer slice a node holds: rows ``row_start .. row_start + rows - 1`` of layer
    ``layer`` on ``pes`` PEs; unpacks as ``(layer, row_start, rows, pes)``."""
    layer: int
    row_start: int
    rows: int
    pes: int

    def check(self):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in self):
            raise ValueError("layer, row_start, rows and pes must be integers")

    def __iter__(self):
        return iter((self.layer, self.row_start, self.rows, self.pes))


def parse_slices(text):
    """``"layer:row_start:rows:pes,..."`` (the ``--set`` form) -> tuple of :class:`Slice`."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.append(Slice(*(int(v) for v in part.split(":"))))
        except (TypeError, ValueError):
            raise ConfigError("slices", "expected comma-separated layer:row_start:rows:pes",
                              value=text) from None
    return tuple(out)


def format_slices(slices):
    """Inverse of :func:`parse_slices`: ``(layer, row_start, rows, pes)`` tuples to
    ``"layer:row_start:rows:pes,..."``."""
    return ",".join(f"{l}:{s}:{r}:{p}" for l, s, r, p in slices)


@dataclass(frozen=True)
class NodeConfig(Config):
    """Configuration of one cluster node's top (:class:`NodeTop`): the model preset, whether the
    node holds the embedding unit (and that unit's board, placement caps and inferences in flight),
    the FC layer slices it computes, multipliers per PE and the beat width of every stream."""
    preset: str = param("cluster-ctr", "model preset (hwgen.recsys.model.PRESETS)",
                        choices=tuple(PRESETS))
    embedding: bool = param(True, "the node holds the embedding lookup unit (node 1)")
    slices: tuple = param((Slice(0, 0, 29, 16), Slice(1, 0, 13, 8), Slice(2, 0, 7, 2),
                           Slice(3, 0, 1, 1)),
                          "FC layer slices held, [{layer, row_start, rows, pes}, ...] (--set: "
                          "'layer:row_start:rows:pes,...'; hwgen.recsys.multinode derives them "
                          "from the partitioner)", item=Slice, parse=parse_slices)
    mults: int = param(4, "multipliers per PE (at most a layer's input length)", lo=1, hi=64)
    lanes: int = param(8, "elements per beat of every stream", lo=1, hi=64)
    board: str = param("u280", "board of the embedding unit's memory channels",
                       choices=board_names())
    index_bits: int = param(13, "bits of a sparse index on i_query", lo=1, hi=32)
    onchip_bytes: int = param(1024, "embedding placement: on-chip bytes for the smallest "
                              "tables", lo=0, hi=1 << 31)
    hbm_channels: int = param(2, "embedding placement: HBM pseudo-channels at most", lo=0,
                              hi=64)
    ddr_channels: int = param(1, "embedding placement: DDR channels at most", lo=0, hi=64)
    hbm_table_max_bytes: int = param(2048, "embedding placement: larger tables go to DDR",
                                     lo=0, hi=1 << 40)
    inflight: int = param(16, "embedding unit: inferences in flight", lo=2, hi=1024)

    @cached_property
    def rec_model(self):
        """The preset's :class:`~hwgen.recsys.model.RecModel`."""
        return preset(self.preset)

    def check(self):
        model = self.rec_model
        slices = self.slices
        text = format_slices(slices)
        if not slices and not self.embedding:
            raise ConfigError("slices", "a node without the embedding unit needs a slice",
                              value=text)
        seen = set()
        for layer, start, rows, pes in slices:
            if not 0 <= layer < len(model.layers) or layer in seen:
                raise ConfigError("slices", f"layer {layer} must be in 0..{len(model.layers) - 1}"
                                  " and appear once", value=text)
            seen.add(layer)
            if rows < 1 or start < 0 or start + rows > model.layers[layer]:
                raise ConfigError("slices", f"rows {start}..{start + rows - 1} outside layer "
                                  f"{layer}'s {model.layers[layer]} rows", value=text)
            if not 1 <= pes <= rows:
                raise ConfigError("slices", f"layer {layer}: pes must be in 1..{rows}",
                                  value=text)
        if self.embedding:
            self.embedding_config

    @property
    def slice_list(self):
        """``slices`` as a list: a :class:`Slice` (``(layer, row_start, rows, pes)``) per
        slice held."""
        return list(self.slices)

    @property
    def layers(self):
        """The layers of which the node holds a slice, in ``slices`` order."""
        return [s.layer for s in self.slice_list]

    def slice_config(self, layer):
        """The :class:`SliceConfig` of this node's slice of ``layer``."""
        model = self.rec_model
        (_, start, rows, pes), = [s for s in self.slice_list if s.layer == layer]
        in_dim = model.layer_shapes[layer][0]
        last = layer == len(model.layers) - 1
        return SliceConfig(
            in_dim=in_dim, out_dim=rows, pes=pes, mults=min(self.mults, in_dim),
            weight_bits=model.weight_bits, act_bits=model.act_bits[layer],
            out_bits=0 if last else model.act_bits[layer + 1], relu=not last,
            shift=0 if last else model.shifts[layer], lanes=self.lanes,
            weight_seed=model.seed, layer=layer, layer_rows=model.layers[layer],
            row_start=start)

    @cached_property
    def embedding_config(self):
        """The :class:`ModelEmbeddingConfig` of the node's embedding unit (whether or not the node
        holds one)."""
        return ModelEmbeddingConfig.of_model(
            self.preset, index_bits=self.index_bits,
            board=self.board, onchip_bytes=self.onchip_bytes, hbm_channels=self.hbm_channels,
            ddr_channels=self.ddr_channels, hbm_table_max_bytes=self.hbm_table_max_bytes,
            lanes=self.lanes, inflight=self.inflight, oob="clamp")

    def derived(self):
        out = {"slices": [{"layer": l, "rows": [s, s + r - 1], "pes": p,
                           "cycles_per_inference":
                               self.slice_config(l).performance()["cycles_per_inference"]}
                          for l, s, r, p in self.slice_list]}
        if self.embedding:
            out["embedding"] = {"initiation_interval": self.embedding_config.interval,
                                "channels": list(self.embedding_config.channel_beats)}
        return out


class NodeTop(wiring.Component):
    """One cluster node: its FC layer slices and, on node 1, the embedding lookup unit.

    Parameters
    ----------
    config : NodeConfig

    Members
    -------
    i_query, o_emb, m_axi_<kind><n> : (only with ``embedding``)
        The embedding lookup unit's ports, unchanged (:class:`~hwgen.recsys.embedding.Embedding`):
        one query beat per inference in, the concatenated vector (``lanes`` elements per beat,
        TLAST on the last) out, one AXI4 read master per used HBM/DDR channel.
    i_x<l> : ``In(stream.Signature(fc.input_layout))`` for every slice of layer ``l``
        The whole input vector of layer ``l`` (``ceil(in_dim / lanes)`` beats per inference).
    o_y<l> : ``Out(stream.Signature(fc.output_layout))``
        The slice's rows of layer ``l``'s output (``ceil(rows / lanes)`` beats, TLAST on the
        last), requantised to the next layer's bits, or the 32-bit accumulator for the last
        layer.

    Latency and backpressure: those of each block (:class:`~hwgen.recsys.fc.FC`,
    :class:`~hwgen.recsys.embedding.Embedding`); the blocks are independent and run
    concurrently, every output may stall at any time and stalls only its own block.
    """

    def __init__(self, config):
        self.config = c = config
        members = {}
        if c.embedding:
            ec = c.embedding_config
            members["i_query"] = In(stream.Signature(ec.query_layout()))
            members["o_emb"] = Out(stream.Signature(ec.output_layout()))
            for ch in ec.placement.channels:
                members[ch.port] = Out(AXI4Signature(ADDR_BITS, ch.data_bits, write=False))
        for layer in c.layers:
            sc = c.slice_config(layer)
            members[f"i_x{layer}"] = In(stream.Signature(input_layout(sc)))
            members[f"o_y{layer}"] = Out(stream.Signature(output_layout(sc)))
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        if c.embedding:
            ec = c.embedding_config
            m.submodules.embedding = emb = Embedding(ec)
            wiring.connect(m, wiring.flipped(self.i_query), emb.i_query)
            wiring.connect(m, emb.o_emb, wiring.flipped(self.o_emb))
            for ch in ec.placement.channels:
                wiring.connect(m, getattr(emb, ch.port), wiring.flipped(getattr(self, ch.port)))
        for layer in c.layers:
            fc = FC(c.slice_config(layer))
            m.submodules[f"fc{layer}"] = fc
            wiring.connect(m, wiring.flipped(getattr(self, f"i_x{layer}")), fc.i_x)
            wiring.connect(m, fc.o_y, wiring.flipped(getattr(self, f"o_y{layer}")))
        return m


class NodeModel(StreamModel):
    """Stream-level model of one run of a :class:`NodeTop` (for :func:`hwgen.flow.simulate.
    simulate` with ``stimulus=``): only the blocks named in the stimulus get inputs and are
    expected to produce outputs; the other ports stay idle and must stay silent.

    Stimulus: ``{"query": {"indices", "dense"}}`` for the embedding unit and/or ``{"x": {layer:
    (items, in_dim) array}, "junk": {layer: (items, pad) array}}`` for slices (``junk`` fills
    the lanes past ``in_dim`` of the last input beat, which the core must ignore).
    """

    def __init__(self, result_port, latency_from):
        self.result_port = result_port
        self.latency_from = latency_from

    def stimulus(self, config, items, rng):
        raise NotImplementedError("a node run's stimulus is given by hwgen.recsys.multinode")

    @staticmethod
    def inputs(config, stim):
        out = {}
        if "query" in stim:
            out["i_query"] = EmbeddingModel.inputs(config.embedding_config, stim["query"])[
                "i_query"]
        for layer, x in stim.get("x", {}).items():
            sc = config.slice_config(layer)
            out[f"i_x{layer}"] = FCModel.inputs(sc, {"x": x, "junk": stim["junk"][layer]})["i_x"]
        return out

    @staticmethod
    def expect(config, stim):
        out = {}
        if config.embedding:
            out["o_emb"] = EmbeddingModel.expect(config.embedding_config, stim["query"])[
                "o_emb"] if "query" in stim else []
        for layer in config.layers:
            x = stim.get("x", {}).get(layer)
            out[f"o_y{layer}"] = [] if x is None else \
                FCModel.expect(config.slice_config(layer), {"x": x})["o_y"]
        return out

    @staticmethod
    def memories(config, stim):
        if not config.embedding:
            return {}
        return EmbeddingModel.memories(config.embedding_config, stim)

    @staticmethod
    def cycles_bound(config, stim):
        bound = 100
        if "query" in stim:
            bound += EmbeddingModel.cycles_bound(config.embedding_config, stim["query"])
        for layer, x in stim.get("x", {}).items():
            bound += FCModel.cycles_bound(config.slice_config(layer), {"x": x})
        return bound
