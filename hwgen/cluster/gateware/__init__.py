"""The cluster's gateware (above :mod:`hwgen.cluster.plan` and :mod:`hwgen.cluster.golden`):
router, kernel switch and packet filter, GMI collectives, gateway, header, row <-> packet
adapters, kernel chains and the per-FPGA tops, each an Amaranth component with its stream
model."""
