"""A ChamVS memory node behind a TCP socket, for the coordinator.

The node holds one shard (:func:`save_shard` / :func:`load_shard`) and answers ``search``
requests (:mod:`hwgen.host.protocol`) either with the node's golden model (``golden``) or by
running the node's Verilog on Verilator with the shard in cocotbext-axi memories (``rtl``; the
simulation is itself checked against the golden model, a disagreement is answered as an error).

Run: ``python -m hwgen.host.node_server SHARD.npz --port 0 --backend golden``; it prints
``listening on <port>`` once ready. Malformed requests are answered with an error and counted
(``stats`` request); the server keeps serving.
"""

import argparse
import json
import pickle
import socketserver
import sys

import numpy as np

from ..errors import HwgenError
from .protocol import ProtocolError, recv_message, send_message

__all__ = ["save_shard", "load_shard", "NodeService", "serve"]


def save_shard(path, config, shard):
    """Write a node's configuration and shard to ``path``."""
    with open(path, "wb") as f:
        pickle.dump({"config": config.to_dict(), "shard": shard}, f)


def load_shard(path):
    from ..vecsearch.node import ChamVSNodeConfig
    with open(path, "rb") as f:
        blob = pickle.load(f)
    return ChamVSNodeConfig.from_dict(blob["config"]), blob["shard"]


class NodeService:
    """Answers search requests for one shard."""

    def __init__(self, config, shard, backend="golden"):
        if backend not in ("golden", "rtl"):
            raise ValueError(f"backend must be golden or rtl, not {backend!r}")
        self.config, self.shard, self.backend = config, shard, backend
        self.counts = {"requests": 0, "errors": 0, "queries": 0}

    def search(self, queries, probes, k):
        from ..vecsearch.node_model import node_data, node_search
        if k != self.config.k:
            raise ProtocolError(f"this node returns k={self.config.k} results, not {k}")
        queries = np.asarray(queries, dtype=np.int64)
        probes = np.asarray(probes, dtype=np.int64)
        if queries.ndim != 2 or queries.shape[1] != self.config.dim or probes.ndim != 2 \
                or len(probes) != len(queries) or not 1 <= probes.shape[1] <= \
                self.config.nprobe_max:
            raise ProtocolError(f"queries must be (q, {self.config.dim}) and probes (q, 1.."
                                f"{self.config.nprobe_max})")
        if probes.size and (probes.min() < 0 or probes.max() >= self.config.nlist):
            raise ProtocolError(f"list ids must be in 0..{self.config.nlist - 1}")
        data = node_data(self.config, self.shard, queries, probes)
        results = [node_search(self.config, data, q, p) for q, p in zip(queries, probes)]
        if self.backend == "rtl":
            results = self._simulate(data, results)
        return [r[0].tolist() for r in results], [r[1].tolist() for r in results]

    def _simulate(self, data, golden_results):
        from .. import registry
        from ..flow.simulate import simulate
        acc = registry.get("chamvs-node")
        run = simulate(acc, self.config, items=len(data.queries), stall=0.1,
                       stimulus={"data": data, "results": golden_results}, keep_outputs=True)
        if run["mismatches"]:
            raise HwgenError(f"RTL disagrees with the golden model ({run['mismatches']} beats)")
        out, cur = [], ([], [])
        for beat in run["outputs"]["o_result"]:
            cur[0].append(beat["dist"])
            cur[1].append(beat["id"])
            if beat["last"]:
                out.append((np.array(cur[0]), np.array(cur[1])))
                cur = ([], [])
        return out

    def handle(self, request):
        self.counts["requests"] += 1
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "stats":
            return dict(self.counts)
        if op == "search":
            dists, ids = self.search(request["queries"], request["probes"], request["k"])
            self.counts["queries"] += len(dists)
            return {"distances": dists, "ids": ids}
        raise ProtocolError(f"unknown op {op!r}")


def serve(service, port=0, host="127.0.0.1", ready=None):
    """Serve ``service`` until killed; ``ready(port)`` is called once listening."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                request = recv_message(self.request)
            except (ProtocolError, OSError):
                service.counts["errors"] += 1
                return
            try:
                reply = service.handle(request)
            except (ProtocolError, HwgenError, KeyError, TypeError, ValueError) as e:
                service.counts["errors"] += 1
                reply = {"error": f"{type(e).__name__}: {e}"}
            try:
                send_message(self.request, reply)
            except OSError:
                service.counts["errors"] += 1

    socketserver.TCPServer.allow_reuse_address = True
    with socketserver.TCPServer((host, port), Handler) as server:
        if ready:
            ready(server.server_address[1])
        server.serve_forever()


def main(argv=None):
    parser = argparse.ArgumentParser(description="Serve one ChamVS node shard over TCP.")
    parser.add_argument("shard")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend", choices=("golden", "rtl"), default="golden")
    args = parser.parse_args(argv)
    config, shard = load_shard(args.shard)
    service = NodeService(config, shard, args.backend)

    def ready(port):
        print(f"listening on {port}", flush=True)

    serve(service, args.port, ready=ready)


if __name__ == "__main__":
    sys.exit(main())
