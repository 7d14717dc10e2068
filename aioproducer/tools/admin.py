"""Creating a topic (CreateTopics), for `aioproducer topic create`.

Names and numbers are checked here, before the request: some brokers (Tansu) accept a topic
with a name Kafka refuses, or with no partitions, which no producer can then use.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .._internal.arguments import check_topic_name
from ..client.cluster import Cluster
from ..client.tasks import TaskSet
from ..config import ProducerConfig
from ..errors import ConfigError, TopicAlreadyExistsError, error_for_code
from ..protocol.messages import ApiKey


async def create_topic(config: ProducerConfig, name: str, partitions: int, *,
                       replication_factor: int = -1, configs: Mapping[str, str] | None = None,
                       timeout: float = 30.0) -> None:
    """Create `name` with `partitions` partitions (`replication_factor` -1: the broker's
    default). Raises InvalidTopicError or ConfigError for what Kafka would refuse,
    TopicAlreadyExistsError, or the broker's error."""
    check_topic_name(name)
    if partitions < 1:
        raise ConfigError(f"a topic needs at least 1 partition, not {partitions}")
    if replication_factor < 1 and replication_factor != -1:
        raise ConfigError(f"the replication factor must be at least 1 (or -1, the broker's "
                          f"default), not {replication_factor}")
    tasks = TaskSet()
    # The metadata fetch must not create the topic before we do.
    cluster = Cluster(dataclasses.replace(config, allow_auto_create_topics=False), tasks)
    try:
        await cluster.refresh()
        # The controller creates topics (newer brokers forward the request to it themselves).
        if cluster.controller_id in cluster.brokers:
            conn = await cluster.connection(cluster.controller_id)
        else:
            conn = await cluster.any_connection()
        response = await conn.request(ApiKey.CREATE_TOPICS, {
            "topics": [{"name": name, "num_partitions": partitions,
                        "replication_factor": replication_factor,
                        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
            "timeout_ms": int(timeout * 1000)})
    finally:
        cluster.close()
        await tasks.aclose()
    [answer] = response["topics"]
    if answer["error_code"] == TopicAlreadyExistsError.error_code:
        raise TopicAlreadyExistsError(f"topic {name!r} already exists")
    if answer["error_code"]:
        detail = answer.get("error_message")
        raise error_for_code(answer["error_code"],
                             f"creating topic {name!r}" + (f" ({detail})" if detail else ""))
