"""ChamVS on the host side: the node server (one shard behind a TCP socket, the simulated node
or the golden model answering), the coordinator that fans queries out to the nodes and merges
their top-k, the shards written for them and the wire protocol they share."""
