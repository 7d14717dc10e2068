"""A rolling restart of three real Apache Kafka nodes, the short form (issue 37): one node
stopped with SIGTERM and started again, then another killed with SIGKILL and started again,
each waited for until it is back in every ISR, while an idempotent producer and a
transactional one stream: no error reaches the application, nothing is lost, duplicated or
reordered, every transaction commits. Each record's wait (enqueue to acknowledgement) is
printed as p50/p99/max. The full roll (every node SIGTERM, then every node SIGKILL) is
`benchmarks/kafka_soak.py --rolling`."""

from __future__ import annotations

import pytest

from tests.support.kafka_chaos import FaultPlan, run_streams, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _short_roll(plan: FaultPlan) -> list:
    return [lambda: plan.restart(0, "stop"), lambda: plan.restart(1, "kill")]


async def test_rolling_restart_passes_unnoticed_by_both_streams(kafka3):
    runs, faults = await run_streams(kafka3, _short_roll, abort_every=None)
    for run in runs:
        print("\n" + summary(f"{run.name} rolling restart", run.result, faults, run.found))
    print("\n".join(faults.log))
    assert faults.stops == 1 and faults.kills == 1
    for run in runs:
        result, found = run.result, run.found
        assert result.app_errors == [] and result.failed == [], (run.name, result.app_errors,
                                                                 result.failed[:3])
        assert (found.lost, found.duplicates, found.reordered) == ([], 0, 0), run.name
        assert found.unexpected == [], run.name
        if run.name == "transactional":
            assert result.unknown == set() and found.torn_transactions == []
            assert len(result.committed) >= 10
        assert result.records >= 500, run.name
