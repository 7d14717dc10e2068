"""ThreadFuture, broker-free: a concurrent.futures.Future to every function that takes one
(wait, as_completed, result with a timeout, callbacks, cancel), though it makes its lock only
when a thread needs it; resolved while other threads wait and add callbacks, nothing is lost
or called twice."""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, as_completed, wait

import pytest

from aioproducer._internal.thread_future import ThreadFuture


def test_it_is_a_future_to_wait_and_as_completed_resolved_from_another_thread():
    futures: list[ThreadFuture[int]] = [ThreadFuture() for _ in range(100)]
    assert all(isinstance(f, Future) and f.take() for f in futures)
    resolver = threading.Timer(0.05, lambda: [f.resolve(i, None) for i, f in enumerate(futures)])
    resolver.start()
    done, not_done = wait(futures[:10], timeout=10, return_when=FIRST_COMPLETED)
    assert done and all(f.done() for f in done)
    assert sorted(f.result() for f in as_completed(futures, timeout=10)) == list(range(100))
    resolver.join()


def test_result_waits_raises_and_times_out():
    future: ThreadFuture[str] = ThreadFuture()
    assert future.take() and future.running()
    with pytest.raises(TimeoutError):
        future.result(timeout=0.01)
    failing: ThreadFuture[str] = ThreadFuture()
    failing.take()
    threading.Timer(0.02, failing.resolve, (None, ValueError("refused"))).start()
    with pytest.raises(ValueError, match="refused"):
        failing.result(timeout=10)
    assert isinstance(failing.exception(), ValueError)
    future.resolve("ok", None)
    assert future.result(0) == "ok" and future.done() and not future.cancelled()


def test_callbacks_run_once_whether_added_before_or_after():
    calls: list[str] = []
    future: ThreadFuture[int] = ThreadFuture()
    future.add_done_callback(lambda f: calls.append(f"before {f.result()}"))
    future.take()
    future.resolve(7, None)
    future.add_done_callback(lambda f: calls.append(f"after {f.result()}"))
    assert calls == ["before 7", "after 7"]


def test_cancel_before_it_is_taken_wins_and_after_it_fails():
    early: ThreadFuture[int] = ThreadFuture()
    assert early.cancel() and early.cancelled()
    assert not early.take()  # the record is not sent
    with pytest.raises(CancelledError):
        early.result(0)
    assert wait([early], timeout=1).done == {early}

    late: ThreadFuture[int] = ThreadFuture()
    assert late.take()
    assert not late.cancel() and not late.cancelled()  # being sent: cannot be unsent
    late.resolve(1, None)
    assert late.result(0) == 1


def test_resolved_while_threads_wait_and_add_callbacks_nothing_is_lost_or_doubled():
    count, threads = 2_000, 4
    futures: list[ThreadFuture[int]] = [ThreadFuture() for _ in range(count)]
    for future in futures:
        future.take()
    called = [0] * count
    results: list[list[int]] = [[] for _ in range(threads)]
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def count_call(index: int) -> None:
        with lock:
            called[index] += 1

    def watcher(me: int) -> None:
        start.wait(10)
        for index in range(me, count, threads):  # some before, some after their resolution
            futures[index].add_done_callback(lambda f, index=index: count_call(index))
            results[me].append(futures[index].result(timeout=10))

    workers = [threading.Thread(target=watcher, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait(10)
    for index, future in enumerate(futures):
        future.resolve(index, None)
    for worker in workers:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers), "a result() never returned"
    assert called == [1] * count
    assert sorted(r for rs in results for r in rs) == list(range(count))
