"""aioproducer: an asyncio-native Kafka producer that speaks the Kafka protocol itself."""

from typing import TYPE_CHECKING, Any

from ._internal.batch import (
    BulkFuture,
    BulkMetadata,
    RecordFailure,
    RecordFuture,
    RecordMetadata,
)
from ._internal.metrics import Histogram, ProducerMetrics, TopicMetrics
from ._internal.thread_future import BulkThreadFuture
from ._version import __version__
from .config import ProducerConfig, ProducerSettings, TokenProvider
from .producer import Producer, accepted
from .serializers import Serializer

if TYPE_CHECKING:
    from .blocking import BlockingProducer

__all__ = ["BlockingProducer", "BulkFuture", "BulkMetadata", "BulkThreadFuture", "Histogram",
           "Producer", "ProducerConfig", "ProducerMetrics", "ProducerSettings", "RecordFailure",
           "RecordFuture", "RecordMetadata", "Serializer", "TokenProvider", "TopicMetrics",
           "__version__", "accepted"]


def __getattr__(name: str) -> Any:
    """BlockingProducer on first use: its thread portal (anyio's) is ~50 ms of imports that
    asyncio code never needs."""
    if name == "BlockingProducer":
        from .blocking import BlockingProducer
        return BlockingProducer
    raise AttributeError(f"module 'aioproducer' has no attribute {name!r}")
