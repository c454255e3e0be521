"""The cluster's specifications (bottom layer): multi-FPGA descriptions (parse, validation,
:class:`~hwgen.cluster.spec.describe.GmiKind`, :class:`~hwgen.cluster.spec.describe.Boundary`),
the packet format, and the validated configuration of every cluster block. Imports nothing
else of the cluster and no gateware component."""
