"""WindVE: embedding serving with CPU overflow (all-MiniLM-L6-v2 on an accelerator, the peak
load that its queue cannot take routed to a CPU instance, the rest answered 'busy'); modules:
model (the embedding model in plain PyTorch), devices (the device detector and the instance
plan), queues (the queue manager), workers (one process and model copy per instance), service
(the HTTP service), estimator (queue depths by linear regression), calibrate (the estimator
on this machine's instances), stress (load generator), compare (the paper's comparison: main
only at its best depth against heterogeneous at the same main depth plus the CPU queue), sweep
(the query-length and CPU-core sweeps of Figs. 5-6), cost (the cost model of Eqs. 4-6); the
``hwgen windve`` commands are :mod:`hwgen.cli.windve`."""
