"""The cluster's plans (above :mod:`hwgen.cluster.spec`): kernel ids, routes, placement and the
block configurations of each FPGA, router load, the packet-level timing model and the kernels'
latencies. Imports no gateware component (the layers contract in ``pyproject.toml``)."""
