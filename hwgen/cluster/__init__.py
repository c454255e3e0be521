"""Multi-FPGA clusters (the multi-FPGA I-BERT paper's Galapagos platform and GMI collectives),
in five layers that import only downward (pyproject's import-linter contract):

* :mod:`~hwgen.cluster.spec`: descriptions, packet format, block configurations;
* :mod:`~hwgen.cluster.plan` (ids, routes, placement, router load, timing models) beside
  :mod:`~hwgen.cluster.golden` (golden models);
* :mod:`~hwgen.cluster.gateware`: the Amaranth components and their stream models;
* :mod:`~hwgen.cluster.run`: builder, multi-FPGA and encoder simulations, benches.
"""
