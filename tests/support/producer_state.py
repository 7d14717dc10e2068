"""What a real Kafka broker keeps of a producer, asked with kafka-python's protocol classes on
a plain socket: the partition leader's producer state (DescribeProducers, KIP-664), and the
dynamic cluster-wide setting after which idle producers' state is dropped
(producer.id.expiration.ms, set with IncrementalAlterConfigs).

Kafka drops a producer's state on a partition once its last batch's timestamp is older than
producer.id.expiration.ms (checked every producer.id.expiration.check.interval.ms, a static
setting: the real-Kafka tier's clusters check every half second) and no transaction of it is
open there."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

from kafka.protocol.admin import DescribeProducersRequest, IncrementalAlterConfigsRequest

from tests.support.raw import call

_BROKER = 4  # ConfigResource.Type.BROKER; name "": the default of every broker
_SET, _DELETE = 0, 1
EXPIRATION = "producer.id.expiration.ms"
# The check interval a cluster must start with for EXPIRATION to take effect within a test.
CHECK_INTERVAL = {"producer.id.expiration.check.interval.ms": 500}


@dataclass(frozen=True)
class ProducerState:
    producer_id: int
    epoch: int
    last_sequence: int


def active_producers(address: str, topic: str, partition: int = 0) -> list[ProducerState]:
    """The producers the partition's leader (at `address`) keeps state for."""
    request = DescribeProducersRequest(version=0, topics=[DescribeProducersRequest.TopicRequest(
        version=0, name=topic, partition_indexes=[partition])])
    response = call(address, request, 0)
    [answer] = [p for t in response.topics for p in t.partitions]
    if answer.error_code:
        raise RuntimeError(f"DescribeProducers {topic}-{partition}: error {answer.error_code} "
                           f"{answer.error_message}")
    return [ProducerState(p.producer_id, p.producer_epoch, p.last_sequence)
            for p in answer.active_producers]


def _set_default(address: str, name: str, value: str | None) -> None:
    resource_cls = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest(version=0, validate_only=False, resources=[
        resource_cls(version=0, resource_type=_BROKER, resource_name="", configs=[
            resource_cls.AlterableConfig(version=0, name=name,
                                         config_operation=_DELETE if value is None else _SET,
                                         value=value)])])
    response = call(address, request, 0)
    for result in response.responses:
        if result.error_code:
            raise RuntimeError(f"IncrementalAlterConfigs {name}={value}: error "
                               f"{result.error_code} {result.error_message}")


@contextlib.contextmanager
def producer_ids_expiring_after(address: str, ms: int) -> Iterator[None]:
    """producer.id.expiration.ms at `ms` on every broker while inside (back to its default
    after)."""
    _set_default(address, EXPIRATION, str(ms))
    try:
        yield
    finally:
        _set_default(address, EXPIRATION, None)


def wait_forgotten(address: str, topic: str, producer_id: int, partition: int = 0,
                   timeout: float = 20.0) -> float:
    """Until the leader no longer keeps state for `producer_id`; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if all(p.producer_id != producer_id for p in active_producers(address, topic, partition)):
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"{topic}-{partition} still keeps producer {producer_id} after "
                         f"{timeout} s")
