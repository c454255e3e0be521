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
    test_configs : tuple of dict, or str
        Configurations the test suite simulates (odd sizes included); a ``module:attribute``
        string names a tuple kept beside the accelerator's code.
    test_items : int
        Items per simulation in the test suite (0: ``default_items``).
    pnr_options : tuple of str
        Extra nextpnr-ecp5 arguments of ``hwgen timing`` for this block (e.g. ``("--placer",
        "static")``); the reference design is placed with the same arguments in the same run,
        so the ratio compares like with like. Empty: the flow's defaults.
    """
    name: str
    summary: str
    config_path: str
    top_path: str
    model_path: str
    testbench: str = "hwgen.sim.stream_tb"
    default_items: int = 1000
    test_configs_spec: object = field(default_factory=tuple)
    test_items: int = 0
    pnr_options: tuple = ()

    @property
    def config(self):
        """The configuration dataclass, imported from ``config_path``."""
        return _load(self.config_path)

    @property
    def test_configs(self):
        """The configurations (dicts of overrides) the test suite simulates, the spec resolved."""
        spec = self.test_configs_spec
        return tuple(_load(spec) if isinstance(spec, str) else spec)

    @property
    def model(self):
        """The stream-model class, imported from ``model_path``."""
        return _load(self.model_path)

    @property
    def top_name(self):
        """The Verilog top module's name: ``name`` with ``_`` for ``-``."""
        return self.name.replace("-", "_")

    def make_config(self, overrides=(), config_file=None, board=None):
        """Default config, then ``config_file`` values, then ``--set`` overrides."""
        cls = self.config
        cfg = cls.from_json(config_file) if config_file else cls()
        if board is not None:
            cfg = cfg.for_board(board)
        return cfg.with_overrides(overrides)

    def build_core(self, config):
        """The Amaranth core component of ``top_path``, constructed from ``config``."""
        return _load(self.top_path)(config)


IBERT_KERNELS = [
    ("ibert-requant", "requant", "Requant",
     "I-BERT dyadic requantisation: multiply by m, round half to even, shift, clamp; optional "
     "residual (identity) branch"),
    ("ibert-gelu", "gelu", "Gelu", "I-BERT integer GELU (i-GELU second-order polynomial)"),
    ("ibert-softmax", "softmax", "Softmax",
     "I-BERT integer softmax: row max, i-exp, 16-bit requant, sum, reciprocal, scaling; rows "
     "of any length up to max_len"),
    ("ibert-layernorm", "layernorm", "LayerNorm",
     "I-BERT integer LayerNorm: mean, variance, exact integer square root, reciprocal, bias"),
    ("ibert-linear", "linear", "Linear",
     "I-BERT INT8 x INT8 -> INT32 linear layer: Tiles x PEs, weights on chip, rows streamed"),
    ("ibert-attn-dot", "attn_dot", "AttnDot",
     "I-BERT attention dot product Q K^T per head, minimal padding of K to the PE count"),
    ("ibert-softmax-matmul", "softmax_matmul", "SoftmaxMatmul",
     "I-BERT softmax x V per head, minimal padding of the softmax matrix"),
]


#: Both exact queues are simulated in the same configurations: k = 1, odd and large k, narrow
#: fields (many ties) and 64-bit fields.
QUEUE_TEST_CONFIGS = (
    {"k": 1, "dist_bits": 8, "id_bits": 8},
    {"k": 7, "dist_bits": 12, "id_bits": 9},
    {"k": 16, "dist_bits": 3, "id_bits": 2},
    {"k": 37, "dist_bits": 32, "id_bits": 32},
    {"k": 64, "dist_bits": 64, "id_bits": 64},
)

ACCELERATORS = {a.name: a for a in [
    Accelerator(
        name="pq-decoder",
        summary="ChamVS PQ decoding unit: m-byte codes to distances via an m x 256 LUT, "
                "one per cycle",
        config_path="hwgen.vecsearch.pq_decoder:PQDecoderConfig",
        top_path="hwgen.vecsearch.pq_decoder:PQDecoder",
        model_path="hwgen.vecsearch.pq_decoder:PQDecoderModel",
        default_items=5000,
        test_items=3000,
        test_configs_spec=(
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
        test_items=3,
        # HeAP left a centroid block RAM's register 2.4 ns of routing away (0.893 / 0.877);
        # the analytic static placer keeps it close (the reference placed the same way)
        pnr_options=("--placer", "static"),
        test_configs_spec=(
            {"dim": 96, "m": 12, "lut_bits": 20},
            {"dim": 35, "m": 7, "elem_bits": 6, "lut_shift": 2, "lut_bits": 12, "sub_par": 3},
            {"dim": 128, "m": 64, "lut_bits": 16, "sub_par": 16},
            {"dim": 16, "m": 16, "elem_bits": 8, "lut_bits": 10, "sub_par": 1},
        ),
    ),
    Accelerator(
        name="systolic-pq",
        summary="ChamVS systolic priority queue: exact top-k of a query, replace-only register "
                "array with compare-swap units, one item every two cycles",
        config_path="hwgen.vecsearch.queues:SystolicPQConfig",
        top_path="hwgen.vecsearch.queues:SystolicPQ",
        model_path="hwgen.vecsearch.queues:QueueModel",
        default_items=3000,
        test_items=2500,
        test_configs_spec=QUEUE_TEST_CONFIGS,
    ),
    Accelerator(
        name="insert-pq",
        summary="Exact top-k insertion queue: comparator per entry, new item shifted into its "
                "sorted place, one item per cycle",
        config_path="hwgen.vecsearch.queues:InsertPQConfig",
        top_path="hwgen.vecsearch.queues:InsertPQ",
        model_path="hwgen.vecsearch.queues:QueueModel",
        default_items=3000,
        test_items=2500,
        test_configs_spec=QUEUE_TEST_CONFIGS,
    ),
    Accelerator(
        name="hier-pq",
        summary="ChamVS approximate hierarchical priority queue: per-stream truncated L1 "
                "queues merged into an L2 top-k queue",
        config_path="hwgen.vecsearch.hier_pq:HierPQConfig",
        top_path="hwgen.vecsearch.hier_pq:HierPQ",
        model_path="hwgen.vecsearch.hier_pq:HierPQModel",
        default_items=4000,
        test_items=3000,
        test_configs_spec=(
            {"streams": 1, "k": 1, "queue": "systolic"},
            {"streams": 3, "k": 5, "l1_len": 2, "dist_bits": 10, "id_bits": 12,
             "queue": "systolic"},
            {"streams": 8, "k": 50, "queue": "systolic"},
            {"streams": 5, "k": 10, "queue": "insert", "dist_bits": 6, "id_bits": 5},
            {"streams": 6, "k": 37, "queue": "insert", "l1_len": 9},
        ),
    ),
    Accelerator(
        name="chamvs-node",
        summary="ChamVS memory node: IVF-PQ search from AXI memory channels (LUT builder, PQ "
                "decoding units, approximate hierarchical K-selection, id fetch)",
        config_path="hwgen.vecsearch.node:ChamVSNodeConfig",
        top_path="hwgen.vecsearch.node:ChamVSNode",
        model_path="hwgen.vecsearch.node_model:ChamVSNodeModel",
        default_items=20,
        test_items=12,
        test_configs_spec=(
            {"m": 16, "k": 10},
            {"m": 64, "k": 37, "channels": 3, "nlist": 7, "nprobe_max": 3},
            {"m": 32, "k": 5, "channels": 2, "queue": "systolic", "nprobe_max": 5},
            {"m": 8, "k": 20, "channels": 1, "nlist": 5, "nprobe_max": 2, "lut_bits": 18,
             "lut_shift": 3},
        ),
    ),
] + [
    Accelerator(
        name=name,
        summary=summary,
        config_path=f"hwgen.ibert.{module}:{cls}Config",
        top_path=f"hwgen.ibert.{module}:{cls}",
        model_path=f"hwgen.ibert.{module}:{cls}Model",
        default_items=200,
        test_configs_spec=f"hwgen.ibert.{module}:TEST_CONFIGS",
        test_items=0,
    )
    for name, module, cls, summary in IBERT_KERNELS
] + [
    Accelerator(
        name="recsys-embedding",
        summary="Recommendation embedding lookup: one row per table from on-chip memories and "
                "AXI memory channels (HBM/DDR) concurrently, concatenated with dense features",
        config_path="hwgen.recsys.embedding:EmbeddingConfig",
        top_path="hwgen.recsys.embedding:Embedding",
        model_path="hwgen.recsys.embedding:EmbeddingModel",
        default_items=200,
        test_configs_spec="hwgen.recsys.embedding:TEST_CONFIGS",
    ),
    Accelerator(
        name="recsys-fc",
        summary="Recommendation fully-connected layer: input broadcast to PEs (parallel "
                "multipliers + adder tree), bias, ReLU, requantisation",
        config_path="hwgen.recsys.fc:FCConfig",
        top_path="hwgen.recsys.fc:FC",
        model_path="hwgen.recsys.fc:FCModel",
        default_items=200,
        test_configs_spec="hwgen.recsys.fc:TEST_CONFIGS",
    ),
    Accelerator(
        name="cluster-router",
        summary="Galapagos router: kernel-id and cluster-id routing tables in on-chip memory "
                "(config stream), packets to the kernel switch or the network, malformed and "
                "unknown-destination packets dropped and counted",
        config_path="hwgen.cluster.spec.router:RouterConfig",
        top_path="hwgen.cluster.gateware.router:Router",
        model_path="hwgen.cluster.gateware.router:RouterModel",
        default_items=200,
        test_configs_spec="hwgen.cluster.gateware.router:TEST_CONFIGS",
    ),
    Accelerator(
        name="gmi-header",
        summary="GMI one-byte header attacher (sending to another cluster) and stripper, one "
                "byte-realignment core",
        config_path="hwgen.cluster.spec.header:HeaderConfig",
        top_path="hwgen.cluster.gateware.header:GMIHeader",
        model_path="hwgen.cluster.gateware.header:HeaderModel",
        default_items=200,
        test_configs_spec="hwgen.cluster.gateware.header:TEST_CONFIGS",
    ),
    Accelerator(
        name="cluster-gateway",
        summary="Gateway kernel: packet decoder (strips the GMI header), virtual GMI kernels, "
                "point-to-point forwarding, AXI-Stream switch; malformed traffic dropped and "
                "counted",
        config_path="hwgen.cluster.spec.gateway:GatewayConfig",
        top_path="hwgen.cluster.gateware.gateway:Gateway",
        model_path="hwgen.cluster.gateware.gateway:GatewayModel",
        default_items=200,
        test_configs_spec="hwgen.cluster.gateware.gateway:TEST_CONFIGS",
    ),
    Accelerator(
        name="cluster-row2pkt",
        summary="Packet adapter, kernel output side: rows of lanes x elements (8/16/32-bit) "
                "to Galapagos packets to one kernel id, rows longer than the maximum packet "
                "split",
        config_path="hwgen.cluster.spec.adapter:RowToPacketsConfig",
        top_path="hwgen.cluster.gateware.adapter:RowToPackets",
        model_path="hwgen.cluster.gateware.adapter:RowToPacketsModel",
        default_items=100,
        test_items=40,
        test_configs_spec="hwgen.cluster.gateware.adapter:ROW2PKT_CONFIGS",
    ),
    Accelerator(
        name="cluster-pkt2row",
        summary="Packet adapter, kernel input side: packets separated by source id (TID) into "
                "one row stream per source, rows counted in elements across packets; unknown "
                "sources dropped and counted",
        config_path="hwgen.cluster.spec.adapter:PacketsToRowsConfig",
        top_path="hwgen.cluster.gateware.adapter:PacketsToRows",
        model_path="hwgen.cluster.gateware.adapter:PacketsToRowsModel",
        default_items=100,
        test_items=40,
        test_configs_spec="hwgen.cluster.gateware.adapter:PKT2ROW_CONFIGS",
    ),
    Accelerator(
        name="cluster-kernel-chain",
        summary="Compute kernel of a layer description: a chain of I-BERT kernels, each "
                "output regrouped into the next kernel's beats (lanes, row ends, widths)",
        config_path="hwgen.cluster.spec.compute:KernelChainConfig",
        top_path="hwgen.cluster.gateware.compute:KernelChain",
        model_path="hwgen.cluster.gateware.compute:KernelChainModel",
        default_items=40,
        test_items=30,
        test_configs_spec="hwgen.cluster.gateware.compute:TEST_CONFIGS",
    ),
] + [
    Accelerator(
        name="maxsim",
        summary="ESPN MaxSim unit: int8 query tokens on chip, document tokens streamed one "
                "per beat (TLAST per document), sum over query tokens of the max dot product, "
                "one int32 score per document",
        config_path="hwgen.espn.maxsim:MaxSimConfig",
        top_path="hwgen.espn.maxsim:MaxSim",
        model_path="hwgen.espn.model:MaxSimModel",
        default_items=200,
        test_configs_spec="hwgen.espn.maxsim:TEST_CONFIGS",
    ),
] + [
    Accelerator(
        name=f"gmi-{kind}",
        summary=summary,
        config_path="hwgen.cluster.spec.gmi:GMIConfig",
        top_path=f"hwgen.cluster.gateware.gmi:{kind.capitalize()}",
        model_path=f"hwgen.cluster.gateware.gmi:{kind.capitalize()}Model",
        default_items=50,
        test_items=30,
        test_configs_spec="hwgen.cluster.gateware.gmi:TEST_CONFIGS",
    )
    for kind, summary in [
        ("broadcast", "GMI broadcast kernel: each message to every group member (MPI_Bcast)"),
        ("scatter", "GMI scatter kernel: members x length elements cut into one chunk per "
                    "member (MPI_Scatter)"),
        ("gather", "GMI gather kernel: one message per member, interleaved rounds, "
                   "concatenated in member order to the root (MPI_Gather)"),
        ("reduce", "GMI reduce kernel: elementwise sum (wrapping) or signed max over the "
                   "members' messages to the root (MPI_Reduce)"),
    ]
]}


def names():
    """Names of the registered accelerators, in registration order."""
    return list(ACCELERATORS)


def get(name):
    """The registered accelerator ``name``; ConfigError naming the choices otherwise."""
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise ConfigError("accelerator", "unknown; choose one of: " + ", ".join(ACCELERATORS),
                          value=name) from None
