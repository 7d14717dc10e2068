"""The one backoff rule, broker-free: doubling per failure, capped, jittered ±20%, back to
the base after a success, and no overflow however long an outage lasts."""

from __future__ import annotations

from aioproducer.client.backoff import Backoff, exponential_backoff


def test_each_failure_doubles_the_wait_up_to_the_cap_with_jitter():
    backoff = Backoff(0.1, 1.0)
    assert backoff.delay == 0.1  # before any failure: the base, as the wait between fetches
    waits = [backoff.failed() for _ in range(8)]
    for wait, nominal in zip(waits, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]):
        assert nominal * 0.8 <= wait <= nominal * 1.2
    assert backoff.delay == waits[-1] and backoff.failures == 8
    backoff.reset()
    assert backoff.delay == 0.1 and 0.08 <= backoff.failed() <= 0.12


def test_jitter_spreads_clients_that_failed_together():
    waits = {round(exponential_backoff(1.0, 3, 60.0), 6) for _ in range(50)}
    assert len(waits) > 10 and min(waits) >= 6.4 and max(waits) <= 9.6


def test_no_overflow_and_no_wait_when_the_base_is_zero():
    assert 48 <= exponential_backoff(0.1, 100_000, 60.0) <= 72
    backoff = Backoff(0.0, 1.0)
    assert [backoff.failed() for _ in range(3)] == [0.0, 0.0, 0.0]
