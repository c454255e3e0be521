"""What retrieval costs in ChamLM, measured beside what a user would run instead.

:func:`time_split` times one generation token by token (the LM step, the query encoding, the
round trip to the node processes and its transport, the node's golden search, CPU faiss on the
same index, the projected node hardware); :func:`split_entry` is one interval's row of it in
``hwgen ralm bench``'s JSON; :func:`throughput` runs batched generation; :func:`transport_probe`
times the transport alone with the LM idle; :func:`rtl_sample` runs a sample of queries on the
nodes' Verilog. ``hwgen ralm bench`` calls them after :func:`hwgen.ralm.chamlm.prepare`.
"""

import time

import numpy as np
from scipy.special import softmax

from ..flow.timing_table import measured_clock
from . import knnlm

__all__ = ["time_split", "split_entry", "throughput", "transport_probe", "rtl_sample", "PAPER"]

#: Chameleon's observations on retrieval frequency (section 6.3, Table 2, Figures 10 and 11).
PAPER = {
    "Dec-S": "dim 512, 24 layers, 101M parameters, retrieves every token (interval 1), K 100",
    "EncDec-S": "dim 512, 2+24 layers, 158M parameters, retrieves every 8/64/512 tokens, K 10",
    "latency": "at steps with retrieval, FPGA-GPU Chameleon is 1.94-4.11x faster than CPU-GPU "
               "(Dec-S); steps without retrieval are the LM's alone",
    "throughput": "the lower the retrieval interval, the larger Chameleon's advantage: 3.18x "
                  "(Dec-S) and 2.34x (Dec-L) at interval 1",
}


def time_split(model, retriever, prompt, tokens=32, interval=1, clock_mhz=None):
    """Generate ``tokens`` greedily after ``prompt`` (ids), retrieving every ``interval``
    tokens, and time each token: ``lm_s`` (one decoding step with the KV cache),
    ``encode_s`` (quantise the state and probe the coarse centroids), ``round_trip_s`` (the
    coordinator's search over TCP, the nodes' work included), ``node_reported_s`` (the
    slowest node's own search time, reported in its reply) and ``transport_s`` (the round
    trip minus it: what the transport costs), split by the slowest node's ``handled_us`` into
    ``node_handling_s`` (its reading, decoding and validation around the search) and
    ``network_s`` (the rest: sockets, encoding, merging, both ends' wake-ups),
    ``node_search_s`` (node 0's golden search of
    the same query, run in this process), ``cpu_faiss_s`` (CPU faiss ``IndexIVFPQ`` over the
    same index with the same nprobe and k, :attr:`Retriever.cpu_index`; every core) and
    ``hw_cycles`` / ``hw_s``: the
    generated node's cycles for the query (:func:`~hwgen.vecsearch.model.layout_query_cycles`,
    the cycle model checked against the node's simulation; the slowest node, as they search
    in parallel) at ``clock_mhz`` (default the board's kernel clock). ``measured``: the kernel
    clock scaled by the node's measured ``fmax_ratio``
    (:func:`hwgen.flow.timing_table.measured_clock`) and the mean hardware time at it
    (``hw_s``: None when the node has not been measured). Returns per-token lists and means."""
    from ..boards import load_board
    services = retriever.local_services
    service = services[0]
    cpu = retriever.cpu_index
    clock = clock_mhz or load_board(service.config.board).kernel_clock_mhz
    cache = model.new_cache()
    logits, hidden = model.forward(prompt, cache)
    rows = []
    for t in range(tokens):
        row = {"token": t, "retrieval": t % interval == 0}
        if row["retrieval"]:
            t0 = time.perf_counter()
            ints, probes = retriever.encode(hidden[-1:])
            t1 = time.perf_counter()
            res = retriever.coordinator.search(ints, probes, retriever.config.k)
            t2 = time.perf_counter()
            service.run_search(ints, probes)
            t3 = time.perf_counter()
            cpu.search(ints.astype(np.float32), retriever.config.k)
            t4 = time.perf_counter()
            cycles = max(_model_cycles(sv, probes[:1])[0] for sv in services)
            row.update(encode_s=t1 - t0, round_trip_s=t2 - t1, node_search_s=t3 - t2,
                       cpu_faiss_s=t4 - t3, hw_cycles=cycles, hw_s=cycles / (clock * 1e6),
                       partial=bool(res.partial))
            row.update(res.transport_split(row["round_trip_s"]))
        nxt = int(np.argmax(logits[-1]))
        t5 = time.perf_counter()
        logits, hidden = model.forward([nxt], cache)
        row["lm_s"] = time.perf_counter() - t5
        rows.append(row)
    mean = {k: float(np.mean([r[k] for r in rows if k in r]))
            for k in ("lm_s", "encode_s", "round_trip_s", "node_reported_s", "transport_s",
                      "node_search_s", "cpu_faiss_s", "hw_cycles", "hw_s")
            if any(k in r for r in rows)}
    median = {k: float(np.median([r[k] for r in rows if k in r]))
              for k in ("round_trip_s", "node_reported_s", "transport_s", "node_handling_s",
                        "network_s")
              if any(k in r for r in rows)}
    kernel = load_board(service.config.board).kernel_clock_mhz
    measured = measured_clock({"chamvs-node"}, kernel)
    measured["hw_s"] = mean["hw_cycles"] / (measured["clock_mhz"] * 1e6) \
        if measured["clock_mhz"] and "hw_cycles" in mean else None
    return {"tokens": tokens, "interval": interval, "clock_mhz": clock, "per_token": rows,
            "mean": mean, "median": median, "measured": measured}


def split_entry(t):
    """One interval's entry of ``hwgen ralm bench``'s ``time_split``, in ms (``us`` for the
    projected node) from a :func:`time_split` result: the LM step, the query encoding, the
    round trip, the transport overhead (median round trip minus the node's own search time)
    and its two parts (``node_handling_ms``, ``network_and_wakeups_ms``), the node's search (golden, in this process), CPU faiss on the same index, the projected
    node hardware (at the measured clock when there is one, else the declared), and per token
    the time with retrieval on CPU faiss and on the projected node, with their ratios."""
    m, med, i = t["mean"], t["median"], t["interval"]
    hw_s = t["measured"]["hw_s"] if t["measured"]["hw_s"] else m.get("hw_s")
    e = {"interval": i, "lm_ms": m["lm_s"] * 1e3, "encode_ms": m.get("encode_s", 0) * 1e3,
         "round_trip_ms": med.get("round_trip_s", 0) * 1e3,
         "transport_overhead_ms": med["transport_s"] * 1e3 if "transport_s" in med else None,
         "node_handling_ms": med["node_handling_s"] * 1e3 if "node_handling_s" in med
         else None,
         "network_and_wakeups_ms": med["network_s"] * 1e3 if "network_s" in med else None,
         "node_search_ms": m.get("node_search_s", 0) * 1e3,
         "cpu_faiss_ms": m.get("cpu_faiss_s", 0) * 1e3,
         "node_projected_us": hw_s * 1e6 if hw_s else None,
         "node_clock": "measured" if t["measured"]["hw_s"] else "declared"}
    if hw_s and e["cpu_faiss_ms"]:
        e["retrieval_speedup"] = e["cpu_faiss_ms"] / (hw_s * 1e3)
        cpu_token = e["lm_ms"] + (e["encode_ms"] + e["cpu_faiss_ms"]) / i
        node_token = e["lm_ms"] + (e["encode_ms"] + (e["transport_overhead_ms"] or 0)
                                   + hw_s * 1e3) / i
        e.update(token_ms_cpu=cpu_token, token_ms_node=node_token,
                 end_to_end_speedup=cpu_token / node_token)
    return e


def throughput(model, retriever, store, prompts, tokens=32, interval=1, lam=0.25,
               clock_mhz=None):
    """Batched generation: the B equal-length ``prompts`` (ids, ``(B, n)``) continued
    ``tokens`` tokens at once, greedily with the kNN-LM (K the nodes', ``lam``), one batched
    LM step (:meth:`~hwgen.ralm.lm.Llama.forward_batch`) per token and, every ``interval``
    tokens, one coordinator search of the B states (each node answers the batch in one
    request). Timed per phase, in seconds over the run: ``lm_s``, ``encode_s``,
    ``round_trip_s`` (the nodes on this CPU), ``mix_s`` (the kNN distribution and the
    interpolation); and, for the same B queries of every retrieval, ``cpu_faiss_s`` (CPU
    faiss over the same index) and ``hw_s`` (the projected node: the generated node's cycles
    for the batch, queries one after another, nodes in parallel, at ``clock_mhz``, default
    the measured clock, else the board's). ``tokens_per_s``: measured (B x tokens / wall),
    and with the retrieval on CPU faiss or on the projected node in place of the round trip
    (LM, encoding and mixing as measured; the node's round trip replaced by the measured
    per-search transport overhead plus ``hw_s``)."""
    from ..boards import load_board
    prompts = np.asarray(prompts, dtype=np.int64)
    B, k, V = len(prompts), retriever.config.k, model.config.vocab
    services, cpu = retriever.local_services, retriever.cpu_index
    kernel = load_board(services[0].config.board).kernel_clock_mhz
    measured = measured_clock({"chamvs-node"}, kernel)
    clock = clock_mhz or measured["clock_mhz"] or kernel
    t = dict.fromkeys(("lm_s", "encode_s", "round_trip_s", "node_reported_s", "mix_s",
                       "cpu_faiss_s", "hw_s"), 0.0)
    searches = 0
    start = time.perf_counter()
    cache = model.new_cache()
    logits, hidden = model.forward_batch(prompts, cache)
    t["lm_s"] += time.perf_counter() - start
    for step in range(tokens):
        if step % interval == 0:
            t0 = time.perf_counter()
            ints, probes = retriever.encode(hidden[:, -1])
            t1 = time.perf_counter()
            res = retriever.coordinator.search(ints, probes, k)
            t2 = time.perf_counter()
            cpu.search(ints.astype(np.float32), k)
            t3 = time.perf_counter()
            t["encode_s"] += t1 - t0
            t["round_trip_s"] += t2 - t1
            t["cpu_faiss_s"] += t3 - t2
            t["node_reported_s"] += res.node_seconds or 0.0
            searches += 1
            t["hw_s"] += max(sum(_model_cycles(sv, probes)) for sv in services) / (clock * 1e6)
            dist, nbr = retriever.arrays(res, B)
        t4 = time.perf_counter()
        moved = knnlm.follow(nbr, step % interval, store.passage)
        p_knn = knnlm.knn_distribution(dist, moved, store.values, V, retriever.temperature)
        p = knnlm.interpolate(softmax(logits[:, -1].astype(np.float64), axis=-1), p_knn, lam)
        nxt = np.argmax(p, axis=-1)
        t5 = time.perf_counter()
        logits, hidden = model.forward_batch(nxt[:, None], cache)
        t["mix_s"] += t5 - t4
        t["lm_s"] += time.perf_counter() - t5
    wall = time.perf_counter() - start
    transport = t["round_trip_s"] - t["node_reported_s"]
    rest = t["lm_s"] + t["encode_s"] + t["mix_s"]
    made = B * tokens
    return {"batch": B, "tokens": tokens, "interval": interval, "searches": searches,
            "clock_mhz": clock, "clock": "measured" if clock == measured["clock_mhz"] else
            ("given" if clock_mhz else "declared"), "wall_s": wall, **t,
            "tokens_per_s": made / wall,
            "tokens_per_s_cpu_faiss": made / (rest + t["cpu_faiss_s"]),
            "tokens_per_s_node": made / (rest + transport + t["hw_s"])}


def transport_probe(retriever, states, repeats=64):
    """The transport alone: ``repeats`` searches of one query each (the rows of ``states`` in
    turn) with nothing else running in this process, timed like :func:`time_split`'s round
    trip, through the retriever's coordinator (every node) and through a coordinator to node 0
    alone (``one_node``: one node process besides this one, so on a 2-core machine no process
    waits for a core). Returns medians in ms: ``round_trip_ms``, ``node_ms`` (the slowest
    node's own search, reported in its reply) and ``transport_overhead_ms`` (per search, round
    trip minus it), its 90th percentile, the ``k`` and the number of searches; and the
    transport split in two by the nodes' ``handled_us``: ``node_handling_ms`` (the node's
    reading, decoding and validation around its search) and ``network_and_wakeups_ms`` (the
    rest: the coordinator's encoding and merging, the sockets, and both ends' wake-ups)."""
    from ..vecsearch.host.coordinator import Coordinator
    out = _probe(retriever.coordinator, retriever, states, repeats)
    one = Coordinator(retriever.addresses[:1], timeout=retriever.coordinator.timeout)
    try:
        out["one_node"] = _probe(one, retriever, states, repeats)
    finally:
        one.close()
    return out


def _probe(coordinator, retriever, states, repeats):
    ints, probes = retriever.encode(states)
    k = retriever.config.k
    rt, node, over, handling, network = [], [], [], [], []
    for i in range(repeats):
        q = i % len(ints)
        t0 = time.perf_counter()
        res = coordinator.search(ints[q:q + 1], probes[q:q + 1], k)
        t1 = time.perf_counter()
        parts = res.transport_split(t1 - t0)
        if not parts or res.partial:
            continue
        rt.append(t1 - t0)
        node.append(parts["node_reported_s"])
        over.append(parts["transport_s"])
        if "node_handling_s" in parts:
            handling.append(parts["node_handling_s"])
            network.append(parts["network_s"])
    if not rt:
        return {"k": k, "searches": 0}
    out = {"k": k, "searches": len(rt), "round_trip_ms": float(np.median(rt)) * 1e3,
           "node_ms": float(np.median(node)) * 1e3,
           "transport_overhead_ms": float(np.median(over)) * 1e3,
           "transport_overhead_p90_ms": float(np.percentile(over, 90)) * 1e3}
    if handling:
        out.update(node_handling_ms=float(np.median(handling)) * 1e3,
                   network_and_wakeups_ms=float(np.median(network)) * 1e3)
    return out


def _model_cycles(service, probes):
    """The generated node's cycles per query (:func:`~hwgen.vecsearch.model.layout_query_cycles`,
    the cycle model checked against the node's simulation) for each row of ``probes`` on the
    node ``service``'s own shard, at its K."""
    from ..vecsearch.model import layout_query_cycles
    return [layout_query_cycles(service.config, service._packed.layout, p,
                                service.config.k)["total"] for p in probes]


def rtl_sample(retriever, states, count=4, log=None):
    """The nodes' generated Verilog on the native engine (Verilator) for the first ``count``
    of ``states``, on every node's own shard: mismatches against the golden model and each
    query's simulated cycles (the node's counters) beside the cycle model's. Returns
    ``{"queries", "mismatches", "timeout", "cycles": [per query, the slowest node],
    "model_cycles": [...], "model_error_mean"}``, or ``{"queries": 0, "reason"}`` when
    Verilator is missing."""
    import dataclasses

    from ..errors import ToolError
    from ..vecsearch.baseline import simulate_sample
    ints, probes = retriever.encode(states[:count])
    per_node, mismatches, timeout = [], 0, False
    for sv in retriever.local_services:
        data = dataclasses.replace(sv._packed, queries=ints, probes=probes)
        try:
            res, cycles = simulate_sample(sv.config, data, len(ints), 1, log)
        except ToolError as e:
            return {"queries": 0, "reason": str(e)}
        mismatches += res["mismatches"]
        timeout = timeout or bool(res["timeout"])
        per_node.append((cycles, _model_cycles(sv, probes)))
    cycles = [max(c[q] for c, _ in per_node) for q in range(len(per_node[0][0]))]
    model = [max(m[q] for _, m in per_node) for q in range(len(ints))]
    error = (float(abs(np.mean(model) - np.mean(cycles)) / np.mean(cycles)) if cycles
             else None)
    return {"queries": len(ints), "nodes": len(per_node), "mismatches": mismatches,
            "timeout": timeout, "cycles": cycles, "model_cycles": model,
            "model_error_mean": error}
