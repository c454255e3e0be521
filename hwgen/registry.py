"""The one registry of accelerators.

The CLI (``hwgen list/build/sim/synth``), the Makefile's per-accelerator targets
(``make pq-decoder`` ...) and the test suite (``tests/test_sim.py``, ``tests/test_config.py``)
all iterate over :data:`ACCELERATORS`. Adding an accelerator is adding one :class:`Accelerator`
entry here.

Entries name their classes by import path, so listing accelerators imports no gateware.
"""

import importlib
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["Accelerator", "ACCELERATORS", "get", "names"]


def _load(path):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Accelerator:
    """One registered accelerator.

    Attributes
    ----------
    name : str
        CLI and Makefile name (``pq-decoder``); the Verilog top is ``name`` with ``_``.
    summary : str
        One line for ``hwgen list``.
    config_path, top_path, model_path : str
        ``module:attribute`` of the config dataclass, the Amaranth core component (constructed
        from a config) and the stream-level model (stimulus + golden expectation).
    testbench : str
        cocotb test module run on the Verilated top.
    default_items : int
        ``hwgen sim --items`` default.
    test_configs : tuple of dict
        Configurations the test suite simulates (odd sizes included).
    """
    name: str
    summary: str
    config_path: str
    top_path: str
    model_path: str
    testbench: str = "sim.stream_tb"
    default_items: int = 1000
    test_configs: tuple = field(default_factory=tuple)

    @property
    def config(self):
        return _load(self.config_path)

    @property
    def model(self):
        return _load(self.model_path)

    @property
    def top_name(self):
        return self.name.replace("-", "_")

    def make_config(self, overrides=(), config_file=None, board=None):
        """Default config, then ``config_file`` values, then ``--set`` overrides."""
        cls = self.config
        cfg = cls.from_json(config_file) if config_file else cls()
        if board is not None and hasattr(cls, "for_board"):
            cfg = cfg.for_board(board)
        return cfg.with_overrides(overrides)

    def build_core(self, config):
        return _load(self.top_path)(config)


ACCELERATORS = {a.name: a for a in [
    Accelerator(
        name="pq-decoder",
        summary="ChamVS PQ decoding unit: m-byte codes to distances via an m x 256 LUT, "
                "one per cycle",
        config_path="hwgen.vecsearch.pq_decoder:PQDecoderConfig",
        top_path="hwgen.vecsearch.pq_decoder:PQDecoder",
        model_path="hwgen.vecsearch.pq_decoder:PQDecoderModel",
        default_items=5000,
        test_configs=(
            {"m": 7, "lut_bits": 13, "tag_bits": 9},
            {"m": 16, "lut_bits": 16, "tag_bits": 32, "lut_buffers": 1},
            {"m": 24, "lut_bits": 18, "tag_bits": 20, "forward_lut": False},
            {"m": 64, "lut_bits": 24, "tag_bits": 64},
            {"m": 1, "lut_bits": 32, "tag_bits": 1},
        ),
    ),
    Accelerator(
        name="lut-builder",
        summary="ChamVS distance-LUT construction: query minus list centroid, squared L2 to "
                "every PQ centroid, 256 rows per (query, list)",
        config_path="hwgen.vecsearch.lut_builder:LUTBuilderConfig",
        top_path="hwgen.vecsearch.lut_builder:LUTBuilder",
        model_path="hwgen.vecsearch.lut_builder:LUTBuilderModel",
        default_items=6,
        test_configs=(
            {"dim": 96, "m": 12, "lut_bits": 20},
            {"dim": 35, "m": 7, "elem_bits": 6, "lut_shift": 2, "lut_bits": 12, "sub_par": 3},
            {"dim": 128, "m": 64, "lut_bits": 16, "sub_par": 16},
            {"dim": 16, "m": 16, "elem_bits": 8, "lut_bits": 10, "sub_par": 1},
        ),
    ),
]}


def names():
    return list(ACCELERATORS)


def get(name):
    """The registered accelerator ``name``; ConfigError naming the choices otherwise."""
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise ConfigError("accelerator", "unknown; choose one of: " + ", ".join(ACCELERATORS),
                          value=name) from None
