"""Where the ChamVS node server used to live: ``python -m hwgen.host.node_server SHARD`` still
runs it. The server is :mod:`hwgen.vecsearch.host.node_server` (``hwgen chamvs serve``)."""

import sys

from ..vecsearch.host.node_server import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
