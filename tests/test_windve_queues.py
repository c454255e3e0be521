"""WindVE's queue manager (paper Algorithm 1) on its own: dispatch order, depths counted in
texts, batching, requeue after a failure, drain. No model, no processes."""

import threading

import pytest

from hwgen.windve.queues import BUSY, DeviceQueue, QueueManager, Request


def _manager(main=4, cpu=2, heterogeneous=True):
    return QueueManager(DeviceQueue("main", main), DeviceQueue("cpu", cpu), heterogeneous)


def test_main_first_then_cpu_then_busy():
    qm = _manager(main=3, cpu=2)
    routes = [qm.dispatch(Request(["t"])) for _ in range(7)]
    assert routes == ["main"] * 3 + ["cpu"] * 2 + [BUSY] * 2
    assert qm.rejected == 2
    assert qm.main.occupancy == 3 and qm.cpu.occupancy == 2


def test_heterogeneous_off_never_uses_the_cpu_queue():
    qm = _manager(main=2, cpu=5, heterogeneous=False)
    assert qm.cpu is None and not qm.heterogeneous
    assert [qm.dispatch(Request(["t"])) for _ in range(3)] == ["main", "main", BUSY]


def test_main_only_requests_skip_the_overflow():
    qm = _manager(main=1, cpu=3)
    assert qm.dispatch(Request(["a"])) == "main"
    assert qm.dispatch(Request(["b"]), main_only=True) is BUSY
    assert qm.dispatch(Request(["c"])) == "cpu"


def test_depth_counts_texts_and_in_service_work():
    q = DeviceQueue("main", 5)
    assert q.try_put(Request(["a", "b", "c"]))
    assert not q.try_put(Request(["d", "e", "f"]))          # 3 + 3 > 5
    assert q.try_put(Request(["d", "e"]))
    batch = q.take_batch(max_batch=8, max_wait=0)
    assert [r.size for r in batch] == [3, 2] and q.occupancy == 5   # still in service
    assert not q.try_put(Request(["x"]))
    q.finish(batch)
    assert q.occupancy == 0 and q.try_put(Request(["x"]))


def test_batches_hold_whole_requests_up_to_max_batch():
    q = DeviceQueue("main", 100)
    for n in (3, 4, 2, 5):
        q.try_put(Request([f"t{k}" for k in range(n)]))
    first = q.take_batch(max_batch=8, max_wait=0)
    assert [r.size for r in first] == [3, 4]                # the 2 would make 9
    second = q.take_batch(max_batch=8, max_wait=0)
    assert [r.size for r in second] == [2, 5]
    big = DeviceQueue("main", 100)
    big.try_put(Request(["t"] * 12))                        # larger than a batch: alone
    assert [r.size for r in big.take_batch(max_batch=8, max_wait=0)] == [12]


@pytest.mark.timeout(60)
def test_an_instance_waits_up_to_max_wait_for_its_batch():
    """The batch returns once filled: with a 600 s max_wait, a queue that waited it out
    would fail on the test's 60 s timeout."""
    q = DeviceQueue("main", 100)
    q.try_put(Request(["a"]))
    threading.Timer(0.05, lambda: q.try_put(Request(["b"]))).start()
    batch = q.take_batch(max_batch=2, max_wait=600.0)
    assert [r.texts for r in batch] == [["a"], ["b"]]


def test_failed_batches_go_back_first_then_give_up():
    q = DeviceQueue("main", 10)
    a, b = Request(["a"]), Request(["b"])
    q.try_put(a)
    q.try_put(b)
    q.try_put(Request(["c"]))
    batch = q.take_batch(max_batch=2, max_wait=0)
    assert q.requeue(batch, max_attempts=2) == []
    again = q.take_batch(max_batch=2, max_wait=0)
    assert again == [a, b]                                   # back at the front, in order
    assert q.requeue(again, max_attempts=2) == [b, a]        # second failure: given up
    assert q.failed == 2 and q.requeued == 2 and q.occupancy == 1


def test_close_drains_what_was_accepted():
    q = DeviceQueue("main", 10)
    for t in "abc":
        q.try_put(Request([t]))
    q.close()
    assert not q.try_put(Request(["late"]))
    taken = []
    while True:
        batch = q.take_batch(max_batch=1, max_wait=0)
        if not batch:
            break
        taken += [r.texts[0] for r in batch]
        q.finish(batch)
    assert taken == ["a", "b", "c"] and q.wait_empty(0)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        DeviceQueue("main", 0)
