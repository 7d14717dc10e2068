"""Leaders that move and brokers that throttle, on one broker behind a proxy that rewrites its
answers with kafka-python's codecs (a client we did not write): KIP-951's new leader named in
a produce response, KIP-219's throttle_time_ms."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer import ProduceResponse

from aioproducer import Producer
from aioproducer.errors import InconsistentClusterIdError
from tests.support.ports import free_port
from tests.support.proxy import FaultProxy
from tests.support.readback import consume_all


def _not_leader(response, leader_id: int, epoch: int, port: int | None = None):
    """NOT_LEADER_OR_FOLLOWER for every partition, naming `leader_id` at `epoch` (and its
    address, when it is a node the client has not heard of)."""
    partition_cls = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    for topic in response.responses:
        for partition in topic.partition_responses:
            partition.error_code, partition.base_offset = 6, -1
            partition.current_leader = partition_cls.LeaderIdAndEpoch(
                version=response.version, leader_id=leader_id, leader_epoch=epoch)
    if port is not None:
        response.node_endpoints = [ProduceResponse.NodeEndpoint(
            version=response.version, node_id=leader_id, host="127.0.0.1", port=port,
            rack=None)]
    return response


async def test_a_new_leader_named_in_the_response_gets_the_batch_at_once(proxied_broker):
    """KIP-951: the broker refuses a batch as no longer the leader and names the new one (a
    node the client had not heard of, with its address). The batch goes there at once: no
    metadata lookup, no retry backoff (a minute here) before the retry; later metadata that
    still names the old leader at an older epoch does not move the partition back. Read
    back once, in order, by librdkafka."""
    cluster = proxied_broker
    cluster.create_topic("moved-951", 1)
    refusals, lookups, at_new_leader = [], [], []

    def refuse_once(response):
        if refusals != ["armed"]:
            return None
        refusals.append("refused")
        return _not_leader(response, 222, 5, new_leader.port)

    def list_node_222(response):
        """Metadata from a broker behind the change: node 222 is in the cluster, but 111
        still leads, at epoch 0."""
        lookups.append(1)
        response.brokers.append(MetadataResponse.MetadataResponseBroker(
            version=response.version, node_id=222, host="127.0.0.1", port=new_leader.port,
            rack=None))
        return response

    cluster.proxy.rewrite_responses(ProduceResponse, refuse_once)
    cluster.proxy.rewrite_responses(MetadataResponse, list_node_222)
    # "Node 222": a second way to the same broker, which has the records.
    with FaultProxy(cluster.broker.port) as new_leader:
        new_leader.rewrite_responses(ProduceResponse, lambda response: at_new_leader.append(1))
        async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=60_000,
                            retry_backoff_max_ms=60_000) as producer:
            await producer.send("moved-951", b"before")
            refusals.append("armed")
            lookups.clear()
            moved = await asyncio.wait_for(producer.send("moved-951", b"moved"), 10)
            looked_up_when_moved = len(lookups)
            metrics = producer.metrics()
            # A topic made now: its metadata is fetched, with moved-951's (leader 111 at
            # epoch 0, older than the move's 5).
            cluster.create_topic("other-951", 1)
            await asyncio.wait_for(producer.send("other-951", b"x"), 10)
            after = await asyncio.wait_for(producer.send("moved-951", b"after"), 10)
    assert refusals == ["armed", "refused"]
    assert looked_up_when_moved == 0, "the producer waited for metadata to find the leader"
    assert metrics.leader_redirects == 1 and metrics.retries == 1
    assert len(lookups) == 1
    assert len(at_new_leader) == 2, "the retry and the next record did not go to the new leader"
    # The broker wrote the refused batch; the retry is a duplicate it dropped (Tansu answers
    # offset -1 then, see tansu.md).
    assert moved.offset in (-1, 1) and after.offset == 2
    got = consume_all(cluster.broker.bootstrap, "moved-951", expected=3)
    assert [r.value for r in got] == [b"before", b"moved", b"after"]


async def test_a_known_node_named_at_a_new_address_is_reached_there(proxied_broker):
    """KIP-951 for a node the client knows, at an address it left: Metadata (from a broker
    behind the change) names node 222 where nothing listens, and a produce response names
    it as the new leader at its new address (NodeEndpoints). The producer takes the new
    address, as Java's client does (Metadata.updatePartitionLeadership: the response's
    nodes override the known ones), and the batch goes there at once. It kept the old
    address of a node it knew: the connect was refused there and backed off (a minute
    here), and each Metadata answer named the old address again, so the send never ended
    (TimeoutError after 10 s)."""
    cluster = proxied_broker
    cluster.create_topic("moved-address-951", 1)
    refusals, at_new_address = [], []
    left = free_port()  # where node 222 was: nothing listens there now

    def refuse_once(response):
        if refusals != ["armed"]:
            return None
        refusals.append("refused")
        return _not_leader(response, 222, 5, new_address.port)

    def list_node_222_where_it_was(response):
        response.brokers.append(MetadataResponse.MetadataResponseBroker(
            version=response.version, node_id=222, host="127.0.0.1", port=left, rack=None))
        return response

    cluster.proxy.rewrite_responses(ProduceResponse, refuse_once)
    cluster.proxy.rewrite_responses(MetadataResponse, list_node_222_where_it_was)
    with FaultProxy(cluster.broker.port) as new_address:  # (the same broker, by another way)
        new_address.rewrite_responses(ProduceResponse,
                                      lambda response: at_new_address.append(1))
        async with Producer(cluster.bootstrap, linger_ms=0, reconnect_backoff_ms=60_000,
                            reconnect_backoff_max_ms=60_000, request_timeout_ms=5_000,
                            delivery_timeout_ms=12_000) as producer:
            await producer.send("moved-address-951", b"before")
            refusals.append("armed")
            await asyncio.wait_for(producer.send("moved-address-951", b"moved"), 10)
            metrics = producer.metrics()
    assert refusals == ["armed", "refused"]
    assert metrics.leader_redirects == 1 and at_new_address == [1]
    got = consume_all(cluster.broker.bootstrap, "moved-address-951", expected=2)
    assert [r.value for r in got] == [b"before", b"moved"]


async def test_every_batch_refused_for_one_move_goes_to_the_new_leader_at_once(cluster):
    """KIP-951 with several batches in flight: three partitions led by node 1, whose answers
    come 0.4 s late, move to node 2; the batches written to node 1 meanwhile (several per
    partition, in several requests) are all refused, each naming node 2 at the same new
    epoch. Every one goes there at once, not only the first (the others used to wait for a
    metadata refresh and the retry backoff, a minute here), and leader_redirects counts
    them all. Each partition's records arrive once, in order."""
    topic = f"moved-all-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 3)
    for p in range(3):
        if cluster.leader(topic, p) != 1:
            cluster.move_leader(topic, p, to=1)
    async with Producer(cluster.bootstrap_servers, linger_ms=0, retry_backoff_ms=60_000,
                        retry_backoff_max_ms=60_000) as producer:
        for p in range(3):
            await asyncio.wait_for(producer.send(topic, b"warm-up", partition=p), 10)
        cluster.slow(1, 0.4)
        for p in range(3):
            cluster.move_leader(topic, p, to=2)
        futures = []
        for i in range(4):
            for p in range(3):
                futures.append(await producer.enqueue(topic, b"%d" % i, partition=p))
            await asyncio.sleep(0.03)
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        metrics = producer.metrics()
    refused = cluster.stats.not_leader
    assert refused > 3, f"only {refused} batches were refused: not several per partition"
    assert metrics.leader_redirects == refused and metrics.retries == refused
    got = consume_all(cluster.bootstrap_servers, topic, expected=15)
    for p in range(3):
        assert [r.value for r in got if r.partition == p] == \
            [b"warm-up", b"0", b"1", b"2", b"3"]


async def test_a_recreated_topic_s_leaders_are_taken_though_their_epochs_start_again(
        cluster, broker):
    """A topic deleted and made again (KIP-516: Metadata names it by a new id) starts its
    leader epochs again at 0. Its new leader is taken though it comes at a lower epoch than
    the old topic's: the old epochs must not keep the old leader, to which every batch went
    and was refused until its delivery timeout."""
    topic = f"recreated-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    async with Producer(cluster.bootstrap_servers, linger_ms=0, delivery_timeout_ms=8000,
                        request_timeout_ms=5000, retry_backoff_max_ms=200) as producer:
        for i in range(3):  # epoch 3 by three moves, each heard of
            cluster.move_leader(topic, 0)
            await asyncio.wait_for(producer.send(topic, b"old-%d" % i), 10)
        cluster.recreate_topic(topic)  # another leader, at epoch 0
        await asyncio.wait_for(producer.send(topic, b"new"), 10)
    # Read from the broker behind the nodes: their Metadata's new id is not the one its Fetch
    # answers give (librdkafka 2.16 crashed on that, in rd_kafka_metadata_cache_find).
    got = consume_all(broker.bootstrap, topic, expected=4)
    assert [r.value for r in got] == [b"old-0", b"old-1", b"old-2", b"new"]


async def test_an_older_leader_epoch_in_a_response_is_ignored(proxied_broker):
    """A refusal naming a leader at an epoch no newer than the one metadata gave (0 here) is
    stale: the producer asks metadata instead of following it."""
    cluster = proxied_broker
    cluster.create_topic("stale-951", 1)
    refusals, lookups = [], []

    def refuse_once(response):
        if refusals != ["armed"]:
            return None
        refusals.append("refused")
        return _not_leader(response, 111, 0)

    cluster.proxy.rewrite_responses(ProduceResponse, refuse_once)
    cluster.proxy.rewrite_responses(MetadataResponse, lambda response: lookups.append(1))
    loop = asyncio.get_running_loop()
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=50) as producer:
        await producer.send("stale-951", b"before")
        refusals.append("armed")
        lookups.clear()
        await asyncio.wait_for(producer.send("stale-951", b"v"), 10)
        metrics = producer.metrics()
        # The lookup runs beside the retry (which may be acknowledged first): wait for it.
        deadline = loop.time() + 5
        while not lookups and loop.time() < deadline:
            await asyncio.sleep(0.02)
    assert refusals == ["armed", "refused"]
    assert metrics.leader_redirects == 0 and metrics.retries == 1
    assert lookups, "no metadata lookup within 5 s of a refusal that named no newer leader"


async def test_a_throttled_broker_gets_nothing_until_the_throttle_ends(proxied_broker):
    """KIP-219: from Produce v6 the broker answers at once with throttle_time_ms and the
    client must hold back that long. The producer writes no request to it until then, and
    says so in its metrics."""
    cluster = proxied_broker
    cluster.create_topic("throttled", 1)
    answered_at: list[float] = []
    requested_at: list[float] = []
    loop = asyncio.get_running_loop()

    def throttle_first(response):
        answered_at.append(loop.time())
        if len(answered_at) == 2:  # the first after the warm-up
            response.throttle_time_ms = 700
            return response
        return None

    cluster.proxy.rewrite_responses(ProduceResponse, throttle_first)
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        await producer.send("throttled", b"warm-up")
        await producer.send("throttled", b"throttled")
        # Sent while the throttle holds: each is written only after it ends.
        futures = [await producer.enqueue("throttled", b"held-%d" % i) for i in range(3)]
        requested_at.append(loop.time())
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        metrics = producer.metrics()
    # The proxy's clock is this process's monotonic clock too (loop.time()).
    assert len(answered_at) >= 3
    assert answered_at[2] - answered_at[1] >= 0.7, \
        f"a request was written {answered_at[2] - answered_at[1]:.3f} s into a 0.7 s throttle"
    assert metrics.produce_throttle_time_ms == 700
    assert metrics.produce_throttle_time_max_ms == 700
    got = consume_all(cluster.broker.bootstrap, "throttled", expected=5)
    assert [r.value for r in got] == [b"warm-up", b"throttled", b"held-0", b"held-1", b"held-2"]


async def test_metadata_from_another_cluster_is_refused(proxied_broker):
    """The bootstrap address now leads to a different Kafka cluster (a DNS name moved): its
    metadata is refused with InconsistentClusterIdError naming both cluster ids, instead of
    records going to partitions of a cluster they were not meant for."""
    cluster = proxied_broker
    cluster.create_topic("ours", 1)
    impostor = []

    def other_cluster(response):
        if not impostor:
            return None
        response.cluster_id = "impostor-cluster"
        return response

    cluster.proxy.rewrite_responses(MetadataResponse, other_cluster)
    async with Producer(cluster.bootstrap, linger_ms=0, max_block_ms=5_000) as producer:
        await producer.send("ours", b"before")
        impostor.append(True)
        cluster.proxy.cut_all()
        cluster.create_topic("theirs", 1)
        with pytest.raises(InconsistentClusterIdError,
                           match="'impostor-cluster', not 'tansu_cluster'"):
            await asyncio.wait_for(producer.send("theirs", b"v"), 10)


async def test_a_leader_named_at_a_new_address_is_connected_to_without_the_old_one_s_backoff(
        cluster):
    """KIP-951 after a node moved: node 2 went down (the producer's connect failed and backs
    off, 2 minutes here), came back at a new address, and took over a partition. The node
    leading it before refuses the next batch naming node 2 with its new address
    (NodeEndpoints): nothing failed at that address, so the producer connects there at
    once, as a Metadata answer naming the node elsewhere already lets it. The backoff kept
    for the old address held the batch back for its full 2 minutes."""
    topic = f"moved-node-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 2)
    cluster.move_leader(topic, 0, to=1)
    cluster.move_leader(topic, 1, to=2)
    old_address = cluster.address(2)
    async with Producer(cluster.address(1), linger_ms=0, reconnect_backoff_ms=120_000,
                        reconnect_backoff_max_ms=120_000, metadata_max_age_ms=300_000,
                        retry_backoff_ms=10) as producer:
        await asyncio.wait_for(producer.send(topic, b"warm-up", partition=0), 10)
        cluster.stop_node(2)
        cluster.move_leader(topic, 1, to=1)  # (the producer has not heard)
        await asyncio.wait_for(producer.send(topic, b"node 2 gone", partition=1), 10)
        assert producer._cluster.backoff_remaining(2) > 60, "no connect to node 2 failed"
        new_address = cluster.move_node(2)
        assert new_address != old_address
        cluster.move_leader(topic, 1, to=2)
        await asyncio.wait_for(producer.send(topic, b"node 2 moved", partition=1), 15)
        metrics = producer.metrics()
    assert metrics.leader_redirects == 1
    got = consume_all(cluster.bootstrap_servers, topic, expected=3)
    assert [r.value for r in got if r.partition == 1] == [b"node 2 gone", b"node 2 moved"]
