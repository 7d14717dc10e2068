"""aioproducer: an asyncio-native Kafka producer that speaks the Kafka protocol itself."""

from ._internal.batch import BulkFuture, RecordFuture, RecordMetadata
from ._internal.metrics import ProducerMetrics
from ._version import __version__
from .blocking import BlockingProducer
from .config import ProducerConfig, ProducerSettings
from .producer import Producer, accepted

__all__ = ["BlockingProducer", "BulkFuture", "Producer", "ProducerConfig", "ProducerMetrics", "ProducerSettings", "RecordFuture",
           "RecordMetadata", "__version__", "accepted"]
