"""The cluster's golden models (above :mod:`hwgen.cluster.spec`, beside
:mod:`hwgen.cluster.plan`): the GMI collectives, the adapters' row <-> packet codec, a kernel
chain's composition, a whole description's layers, and the packet filters' traffic and
counters. Pure numpy; the gateware's stream models compare with these."""
