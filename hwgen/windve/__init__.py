"""WindVE: embedding serving with CPU overflow (all-MiniLM-L6-v2 on an accelerator, the peak
load that its queue cannot take routed to a CPU instance, the rest answered 'busy'); modules:
model (the embedding model in plain PyTorch), devices (the device detector and the instance
plan), queues (the queue manager), workers (one process and model copy per instance), service
(the HTTP service), estimator (queue depths by linear regression), stress (load generator);
the ``hwgen windve`` commands are :mod:`hwgen.cli.windve`."""
