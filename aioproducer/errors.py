"""The exception tree, and every Kafka error code as a named exception.

`except KafkaError` catches every error of the producer (not asyncio's own: RuntimeError for
a call from another event loop, TimeoutError from flush(timeout=...)). Four flags say what
can be done about an error: `retriable` (trying again may work; the producer retries these
itself within delivery_timeout_ms), `abortable` (the current transaction must be aborted,
then the producer goes on), `fatal` (the producer cannot continue: close it) and
`refresh_metadata` (what the producer knows of a partition's leader is stale: it fetches
metadata again before it retries). They say what an error usually means; a few mean
more from a transaction coordinator (INVALID_TXN_STATE is fatal there, as in the Java
client), and inside a transaction any failed record makes the transaction abortable.

These classes and flags are the one table of Kafka's error codes: the rest of the package
decides by flag or class (`isinstance(exc, NotCoordinatorError)`), never by a bare number.
This module imports nothing from the package at run time (a type checker reads the
framing's Response, which FramingError carries), so every layer may use it: the framing's
errors are defined here, not in the protocol layer, to be importable with the others.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .protocol.framing import Response


class KafkaError(Exception):
    """Base of every error aioproducer raises."""

    retriable = False
    abortable = False
    fatal = False
    refresh_metadata = False


class RetriableError(KafkaError):
    """Trying again may succeed (the producer does so itself until delivery_timeout_ms)."""

    retriable = True


# -- KIP-1050: one class, and one action, for every error a transactional call can meet ------
#
# | class                      | base                          | what to do                      |
# |----------------------------|-------------------------------|---------------------------------|
# | retriable                  | RetriableError                | nothing: the producer retries   |
# |                            |                               | within its deadline             |
# | refresh and retry          | RefreshRetriableError         | nothing: the producer looks up  |
# |                            |                               | the leader or coordinator again |
# | abortable                  | AbortableError                | abort_transaction(), then go on |
# | application-recoverable    | ApplicationRecoverableError   | close; a new producer with the  |
# |                            |                               | same transactional_id goes on   |
# | invalid configuration      | InvalidConfigurationError     | close; fix settings or ACLs     |
# | fatal                      | FatalError                    | close                           |
#
# A retriable error that outlives its deadline inside a transaction (a record's delivery
# timeout, send_offsets_to_transaction() past max_block_ms) makes the transaction abortable;
# so does any other failure of a record in it. `error_class()` names an error's class.


class RefreshRetriableError(RetriableError):
    """Retriable once the producer has looked up the partition's leader or the coordinator
    again, which it does itself (KIP-1050's refresh-and-retry)."""


class AbortableError(KafkaError):
    """The transaction cannot commit: abort it (abort_transaction()), then the producer goes
    on with the next one (KIP-1050's abortable)."""

    abortable = True


class ApplicationRecoverableError(KafkaError):
    """This producer cannot go on, but the application can: close it and start a new one with
    the same transactional_id (KIP-1050's application-recoverable; a fenced producer)."""

    fatal = True


class InvalidConfigurationError(KafkaError):
    """A setting, a permission or the broker's version does not allow this: close the
    producer and fix it (KIP-1050's invalid configuration)."""

    fatal = True


class FatalError(KafkaError):
    """The producer cannot go on: close it (KIP-1050's fatal)."""

    fatal = True


class ConfigError(InvalidConfigurationError, ValueError):
    """A setting is unknown, of the wrong type, out of range, or contradicts another."""


class InvalidRecordError(KafkaError, TypeError):
    """An argument of send()/enqueue() has the wrong type or value."""


class SerializationError(KafkaError):
    """A key_serializer or value_serializer failed or returned something other than bytes."""


class BufferExhaustedError(KafkaError, TimeoutError):
    """No buffer memory became free within max_block_ms."""


class DeliveryTimeoutError(RetriableError, TimeoutError):
    """A record was not acknowledged within delivery_timeout_ms."""


class ProducerClosedError(KafkaError):
    """The producer is closed (or was never started, or stopped after a failure)."""


class EventLoopEndedError(ProducerClosedError, RuntimeError):
    """The event loop that started the producer has ended (asyncio.run() returned, or a
    test's loop closed) without close(): it can send nothing more. Make a producer in the
    loop that uses it. Also a RuntimeError, which it was before it had a class."""


class KafkaConnectionError(RetriableError):
    """A broker could not be reached, or the connection was lost."""


class TransactionStateError(KafkaError):
    """A transaction call is not allowed in the transaction's current state."""


class TransactionFailedError(TransactionStateError, AbortableError):
    """The transaction failed (its cause says why: a record's error, offsets that may be
    missing, a timeout inside it): abort it, then go on."""


class ProducerFailedError(TransactionStateError, FatalError):
    """The producer met a fatal error earlier (its cause): close it."""


class TransactionAbortedError(KafkaError):
    """The record's transaction was aborted before the record was sent."""


class AuthenticationError(KafkaError):
    """SASL or TLS authentication with a broker failed."""

    fatal = True


# -- errors the brokers report by code --------------------------------------------------------


_BY_CODE: dict[int, type[BrokerError]] = {}
ERROR_CLASSES: Mapping[int, type[BrokerError]] = _BY_CODE  # error code -> class


class BrokerError(KafkaError):
    """An error a broker answered with; `error_code` and `name` are Kafka's."""

    error_code = -1
    name = "UNKNOWN_SERVER_ERROR"
    description = "The server experienced an unexpected error when processing the request."

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "error_code" in cls.__dict__:  # one class per Kafka error code
            cls.description = " ".join((cls.__doc__ or "").split())
            _BY_CODE[cls.error_code] = cls

    def __init__(self, message: str | None = None) -> None:
        self.message = message
        text = f"[{self.name}] {self.description}"
        super().__init__(f"{message}: {text}" if message else text)

    def __reduce__(self) -> tuple[type[BrokerError], tuple[str | None]]:  # pickle (Spark ships errors between processes) with the message
        return (type(self), (self.message,))


_BY_CODE[-1] = BrokerError


class UnknownTopicError(RetriableError):
    """The topic (or partition) does not exist, or is not yet known to the cluster."""


class InvalidTopicError(KafkaError, ValueError):
    """The topic name is not valid (empty, too long, or with characters Kafka refuses)."""


class RecordTooLargeError(KafkaError):
    """A record (or the batch holding it) is larger than max_request_size or the broker's limit."""


class ProducerFencedError(ApplicationRecoverableError):
    """Another producer with the same transactional_id (and a newer epoch) has started."""


class CorruptMessageError(RetriableError):
    """A frame or record batch failed its checks (CRC, length): corrupt, or not Kafka at all."""


class FramingError(CorruptMessageError):
    """The peer broke the framing, so nothing after this point of the stream can be read and
    the connection must close (retriable: a new connection may do fine). `responses` holds the
    responses completed before the bad bytes in the same `receive_data()` call: they are good,
    and are handed on before the connection closes."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.responses: list[Response] = []


class FrameSizeError(FramingError):
    """A size prefix no Kafka broker sends: shorter than a correlation id (typically a peer
    that is not Kafka, or TLS spoken to plaintext), or over the connection's
    max_response_bytes (receive_message_max_bytes)."""


class CorrelationIdError(FramingError):
    """A response to a request while an earlier one is still unanswered: Kafka answers the
    requests of a connection in order, so the stream cannot be trusted to match any more."""


class UnsupportedVersionError(InvalidConfigurationError):
    """The broker speaks no version of a request that we do."""


class RequestTimeoutError(RetriableError, TimeoutError):
    """No response arrived within request_timeout_ms."""


class OutOfOrderSequenceNumberError(KafkaError):
    """The broker received a sequence number it did not expect (a gap)."""


class DuplicateSequenceNumberError(KafkaError):
    """The broker already has this batch (a retry of something it wrote)."""


class UnknownProducerIdError(KafkaError):
    """The broker no longer knows our producer id (its state expired or was lost). Apache
    Kafka 3.9 and 4.4 never send it: a leader without state takes any sequence instead."""


# -- Kafka's error codes (clients/.../common/protocol/Errors.java) ----------------------------
# Each a class of its own, so `except NotLeaderOrFollowerError` works and type checkers see
# every name. A second base names the contract class an error also is (so `except
# UnknownTopicError` catches both our own check and the broker's answer); where the names
# clash, the broker's class is prefixed "Broker". The docstring is Kafka's description.


class OffsetOutOfRangeError(BrokerError):
    """The requested offset is not within the range of offsets maintained by the server."""

    error_code, name = 1, "OFFSET_OUT_OF_RANGE"


class BrokerCorruptMessageError(BrokerError, CorruptMessageError):
    """This message has failed its CRC checksum, exceeds the valid size, has a null key for
    a compacted topic, or is otherwise corrupt."""

    error_code, name = 2, "CORRUPT_MESSAGE"


class UnknownTopicOrPartitionError(BrokerError, UnknownTopicError, RefreshRetriableError):
    """This server does not host this topic-partition."""

    error_code, name = 3, "UNKNOWN_TOPIC_OR_PARTITION"
    refresh_metadata = True


class InvalidFetchSizeError(BrokerError):
    """The requested fetch size is invalid."""

    error_code, name = 4, "INVALID_FETCH_SIZE"


class LeaderNotAvailableError(BrokerError, RefreshRetriableError):
    """There is no leader for this topic-partition as we are in the middle of a leadership
    election."""

    error_code, name = 5, "LEADER_NOT_AVAILABLE"
    refresh_metadata = True


class NotLeaderOrFollowerError(BrokerError, RefreshRetriableError):
    """For requests intended only for the leader, this error indicates that the broker is
    not the current leader."""

    error_code, name = 6, "NOT_LEADER_OR_FOLLOWER"
    refresh_metadata = True


class RequestTimedOutError(BrokerError, RequestTimeoutError):
    """The request timed out."""

    error_code, name = 7, "REQUEST_TIMED_OUT"


class BrokerNotAvailableError(BrokerError):
    """The broker is not available."""

    error_code, name = 8, "BROKER_NOT_AVAILABLE"


class ReplicaNotAvailableError(BrokerError, RefreshRetriableError):
    """The replica is not available for the requested topic-partition."""

    error_code, name = 9, "REPLICA_NOT_AVAILABLE"
    refresh_metadata = True


class MessageTooLargeError(BrokerError, RecordTooLargeError):
    """The request included a message larger than the max message size the server will
    accept."""

    error_code, name = 10, "MESSAGE_TOO_LARGE"


class StaleControllerEpochError(BrokerError):
    """The controller moved to another broker."""

    error_code, name = 11, "STALE_CONTROLLER_EPOCH"


class OffsetMetadataTooLargeError(BrokerError):
    """The metadata field of the offset request was too large."""

    error_code, name = 12, "OFFSET_METADATA_TOO_LARGE"


class NetworkError(BrokerError, RefreshRetriableError):
    """The server disconnected before a response was received."""

    error_code, name = 13, "NETWORK_EXCEPTION"
    refresh_metadata = True


class CoordinatorLoadInProgressError(BrokerError, RetriableError):
    """The coordinator is loading and hence can't process requests."""

    error_code, name = 14, "COORDINATOR_LOAD_IN_PROGRESS"


class CoordinatorNotAvailableError(BrokerError, RefreshRetriableError):
    """The coordinator is not available."""

    error_code, name = 15, "COORDINATOR_NOT_AVAILABLE"


class NotCoordinatorError(BrokerError, RefreshRetriableError):
    """This is not the correct coordinator."""

    error_code, name = 16, "NOT_COORDINATOR"


class BrokerInvalidTopicError(BrokerError, InvalidTopicError):
    """The request attempted to perform an operation on an invalid topic."""

    error_code, name = 17, "INVALID_TOPIC_EXCEPTION"


class RecordListTooLargeError(BrokerError, RecordTooLargeError):
    """The request included message batch larger than the configured segment size on the
    server."""

    error_code, name = 18, "RECORD_LIST_TOO_LARGE"


class NotEnoughReplicasError(BrokerError, RetriableError):
    """Messages are rejected since there are fewer in-sync replicas than required."""

    error_code, name = 19, "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(BrokerError, RetriableError):
    """Messages are written to the log, but to fewer in-sync replicas than required."""

    error_code, name = 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class InvalidRequiredAcksError(BrokerError):
    """Produce request specified an invalid value for required acks."""

    error_code, name = 21, "INVALID_REQUIRED_ACKS"


class IllegalGenerationError(BrokerError, AbortableError):
    """Specified group generation id is not valid."""

    error_code, name = 22, "ILLEGAL_GENERATION"


class InconsistentGroupProtocolError(BrokerError):
    """The group member's supported protocols are incompatible with those of existing
    members."""

    error_code, name = 23, "INCONSISTENT_GROUP_PROTOCOL"


class InvalidGroupIdError(BrokerError):
    """The configured groupId is invalid."""

    error_code, name = 24, "INVALID_GROUP_ID"


class UnknownMemberIdError(BrokerError, AbortableError):
    """The coordinator is not aware of this member."""

    error_code, name = 25, "UNKNOWN_MEMBER_ID"


class InvalidSessionTimeoutError(BrokerError):
    """The session timeout is not within the range allowed by the broker."""

    error_code, name = 26, "INVALID_SESSION_TIMEOUT"


class RebalanceInProgressError(BrokerError):
    """The group is rebalancing, so a rejoin is needed."""

    error_code, name = 27, "REBALANCE_IN_PROGRESS"


class InvalidCommitOffsetSizeError(BrokerError):
    """The committing offset data size is not valid."""

    error_code, name = 28, "INVALID_COMMIT_OFFSET_SIZE"


class TopicAuthorizationFailedError(BrokerError, AbortableError):
    """Topic authorization failed."""

    error_code, name = 29, "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(BrokerError, AbortableError):
    """Group authorization failed."""

    error_code, name = 30, "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(BrokerError, InvalidConfigurationError):
    """Cluster authorization failed."""

    error_code, name = 31, "CLUSTER_AUTHORIZATION_FAILED"


class InvalidTimestampError(BrokerError):
    """The timestamp of the message is out of acceptable range."""

    error_code, name = 32, "INVALID_TIMESTAMP"


class UnsupportedSaslMechanismError(BrokerError):
    """The broker does not support the requested SASL mechanism."""

    error_code, name = 33, "UNSUPPORTED_SASL_MECHANISM"
    fatal = True


class IllegalSaslStateError(BrokerError):
    """Request is not valid given the current SASL state."""

    error_code, name = 34, "ILLEGAL_SASL_STATE"
    fatal = True


class BrokerUnsupportedVersionError(BrokerError, UnsupportedVersionError):
    """The version of API is not supported."""

    error_code, name = 35, "UNSUPPORTED_VERSION"


class TopicAlreadyExistsError(BrokerError):
    """Topic with this name already exists."""

    error_code, name = 36, "TOPIC_ALREADY_EXISTS"


class InvalidPartitionsError(BrokerError):
    """Number of partitions is below 1."""

    error_code, name = 37, "INVALID_PARTITIONS"


class InvalidReplicationFactorError(BrokerError):
    """Replication factor is below 1 or larger than the number of available brokers."""

    error_code, name = 38, "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(BrokerError):
    """Replica assignment is invalid."""

    error_code, name = 39, "INVALID_REPLICA_ASSIGNMENT"


class InvalidConfigError(BrokerError):
    """Configuration is invalid."""

    error_code, name = 40, "INVALID_CONFIG"


class NotControllerError(BrokerError, RetriableError):
    """This is not the correct controller for this cluster."""

    error_code, name = 41, "NOT_CONTROLLER"


class InvalidRequestError(BrokerError):
    """This most likely occurs because of a request being malformed by the client library or
    the message was sent to an incompatible broker."""

    error_code, name = 42, "INVALID_REQUEST"


class UnsupportedForMessageFormatError(BrokerError, InvalidConfigurationError):
    """The message format version on the broker does not support the request."""

    error_code, name = 43, "UNSUPPORTED_FOR_MESSAGE_FORMAT"


class PolicyViolationError(BrokerError):
    """Request parameters do not satisfy the configured policy."""

    error_code, name = 44, "POLICY_VIOLATION"


class BrokerOutOfOrderSequenceNumberError(BrokerError, OutOfOrderSequenceNumberError):
    """The broker received an out of order sequence number."""

    error_code, name = 45, "OUT_OF_ORDER_SEQUENCE_NUMBER"


class BrokerDuplicateSequenceNumberError(BrokerError, DuplicateSequenceNumberError):
    """The broker received a duplicate sequence number."""

    error_code, name = 46, "DUPLICATE_SEQUENCE_NUMBER"


class InvalidProducerEpochError(BrokerError, AbortableError):
    """Producer attempted to produce with an old epoch."""

    error_code, name = 47, "INVALID_PRODUCER_EPOCH"


class InvalidTxnStateError(BrokerError, FatalError):
    """The producer attempted a transactional operation in an invalid state."""

    error_code, name = 48, "INVALID_TXN_STATE"


class InvalidProducerIdMappingError(BrokerError, AbortableError):
    """The producer attempted to use a producer id which is not currently assigned to its
    transactional id."""

    error_code, name = 49, "INVALID_PRODUCER_ID_MAPPING"


class InvalidTransactionTimeoutError(BrokerError, InvalidConfigurationError):
    """The transaction timeout is larger than the maximum value allowed by the broker (as
    configured by transaction.max.timeout.ms)."""

    error_code, name = 50, "INVALID_TRANSACTION_TIMEOUT"


class ConcurrentTransactionsError(BrokerError, RetriableError):
    """The producer attempted to update a transaction while another concurrent operation on
    the same transaction was ongoing."""

    error_code, name = 51, "CONCURRENT_TRANSACTIONS"


class TransactionCoordinatorFencedError(BrokerError, FatalError):
    """Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the
    current coordinator for a given producer."""

    error_code, name = 52, "TRANSACTION_COORDINATOR_FENCED"


class TransactionalIdAuthorizationFailedError(BrokerError, InvalidConfigurationError):
    """Transactional Id authorization failed."""

    error_code, name = 53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class SecurityDisabledError(BrokerError):
    """Security features are disabled."""

    error_code, name = 54, "SECURITY_DISABLED"


class OperationNotAttemptedError(BrokerError):
    """The broker did not attempt to execute this operation."""

    error_code, name = 55, "OPERATION_NOT_ATTEMPTED"


class KafkaStorageErrorError(BrokerError, RefreshRetriableError):
    """Disk error when trying to access log file on the disk."""

    error_code, name = 56, "KAFKA_STORAGE_ERROR"
    refresh_metadata = True


class LogDirNotFoundError(BrokerError):
    """The user-specified log directory is not found in the broker config."""

    error_code, name = 57, "LOG_DIR_NOT_FOUND"


class SaslAuthenticationFailedError(BrokerError, AuthenticationError):
    """SASL Authentication failed."""

    error_code, name = 58, "SASL_AUTHENTICATION_FAILED"


class BrokerUnknownProducerIdError(BrokerError, UnknownProducerIdError):
    """This exception is raised by the broker if it could not locate the producer metadata
    associated with the producerId in question."""

    error_code, name = 59, "UNKNOWN_PRODUCER_ID"


class ReassignmentInProgressError(BrokerError):
    """A partition reassignment is in progress."""

    error_code, name = 60, "REASSIGNMENT_IN_PROGRESS"


class DelegationTokenAuthDisabledError(BrokerError):
    """Delegation Token feature is not enabled."""

    error_code, name = 61, "DELEGATION_TOKEN_AUTH_DISABLED"


class DelegationTokenNotFoundError(BrokerError):
    """Delegation Token is not found on server."""

    error_code, name = 62, "DELEGATION_TOKEN_NOT_FOUND"


class DelegationTokenOwnerMismatchError(BrokerError):
    """Specified Principal is not valid Owner/Renewer."""

    error_code, name = 63, "DELEGATION_TOKEN_OWNER_MISMATCH"


class DelegationTokenRequestNotAllowedError(BrokerError):
    """Delegation Token requests are not allowed on PLAINTEXT/1-way SSL channels and on
    delegation token authenticated channels."""

    error_code, name = 64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED"


class DelegationTokenAuthorizationFailedError(BrokerError):
    """Delegation Token authorization failed."""

    error_code, name = 65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED"


class DelegationTokenExpiredError(BrokerError):
    """Delegation Token is expired."""

    error_code, name = 66, "DELEGATION_TOKEN_EXPIRED"


class InvalidPrincipalTypeError(BrokerError):
    """Supplied principalType is not supported."""

    error_code, name = 67, "INVALID_PRINCIPAL_TYPE"


class NonEmptyGroupError(BrokerError):
    """The group is not empty."""

    error_code, name = 68, "NON_EMPTY_GROUP"


class GroupIdNotFoundError(BrokerError):
    """The group id does not exist."""

    error_code, name = 69, "GROUP_ID_NOT_FOUND"


class FetchSessionIdNotFoundError(BrokerError, RetriableError):
    """The fetch session ID was not found."""

    error_code, name = 70, "FETCH_SESSION_ID_NOT_FOUND"


class InvalidFetchSessionEpochError(BrokerError, RetriableError):
    """The fetch session epoch is invalid."""

    error_code, name = 71, "INVALID_FETCH_SESSION_EPOCH"


class ListenerNotFoundError(BrokerError, RetriableError):
    """There is no listener on the leader broker that matches the listener on which metadata
    request was processed."""

    error_code, name = 72, "LISTENER_NOT_FOUND"


class TopicDeletionDisabledError(BrokerError):
    """Topic deletion is disabled."""

    error_code, name = 73, "TOPIC_DELETION_DISABLED"


class FencedLeaderEpochError(BrokerError, RefreshRetriableError):
    """The leader epoch in the request is older than the epoch on the broker."""

    error_code, name = 74, "FENCED_LEADER_EPOCH"
    refresh_metadata = True


class UnknownLeaderEpochError(BrokerError, RefreshRetriableError):
    """The leader epoch in the request is newer than the epoch on the broker."""

    error_code, name = 75, "UNKNOWN_LEADER_EPOCH"
    refresh_metadata = True


class UnsupportedCompressionTypeError(BrokerError):
    """The requesting client does not support the compression type of given partition."""

    error_code, name = 76, "UNSUPPORTED_COMPRESSION_TYPE"


class StaleBrokerEpochError(BrokerError):
    """Broker epoch has changed."""

    error_code, name = 77, "STALE_BROKER_EPOCH"


class OffsetNotAvailableError(BrokerError, RetriableError):
    """The leader high watermark has not caught up from a recent leader election so the
    offsets cannot be guaranteed to be monotonically increasing."""

    error_code, name = 78, "OFFSET_NOT_AVAILABLE"


class MemberIdRequiredError(BrokerError):
    """The group member needs to have a valid member id before actually entering a consumer
    group."""

    error_code, name = 79, "MEMBER_ID_REQUIRED"


class PreferredLeaderNotAvailableError(BrokerError, RetriableError):
    """The preferred leader was not available."""

    error_code, name = 80, "PREFERRED_LEADER_NOT_AVAILABLE"


class GroupMaxSizeReachedError(BrokerError):
    """The consumer group has reached its max size."""

    error_code, name = 81, "GROUP_MAX_SIZE_REACHED"


class FencedInstanceIdError(BrokerError, ApplicationRecoverableError):
    """The broker rejected this static consumer since another consumer with the same
    group.instance.id has registered with a different member.id."""

    error_code, name = 82, "FENCED_INSTANCE_ID"


class EligibleLeadersNotAvailableError(BrokerError, RetriableError):
    """Eligible topic partition leaders are not available."""

    error_code, name = 83, "ELIGIBLE_LEADERS_NOT_AVAILABLE"


class ElectionNotNeededError(BrokerError, RetriableError):
    """Leader election not needed for topic partition."""

    error_code, name = 84, "ELECTION_NOT_NEEDED"


class NoReassignmentInProgressError(BrokerError):
    """No partition reassignment is in progress."""

    error_code, name = 85, "NO_REASSIGNMENT_IN_PROGRESS"


class GroupSubscribedToTopicError(BrokerError):
    """Deleting offsets of a topic is forbidden while the consumer group is actively
    subscribed to it."""

    error_code, name = 86, "GROUP_SUBSCRIBED_TO_TOPIC"


class BrokerInvalidRecordError(BrokerError):
    """This record has failed the validation on broker and hence will be rejected."""

    error_code, name = 87, "INVALID_RECORD"


class UnstableOffsetCommitError(BrokerError, RetriableError):
    """There are unstable offsets that need to be cleared."""

    error_code, name = 88, "UNSTABLE_OFFSET_COMMIT"


class ThrottlingQuotaExceededError(BrokerError, RetriableError):
    """The throttling quota has been exceeded."""

    error_code, name = 89, "THROTTLING_QUOTA_EXCEEDED"


class BrokerProducerFencedError(BrokerError, ProducerFencedError):
    """There is a newer producer with the same transactionalId which fences the current one."""

    error_code, name = 90, "PRODUCER_FENCED"


class ResourceNotFoundError(BrokerError):
    """A request illegally referred to a resource that does not exist."""

    error_code, name = 91, "RESOURCE_NOT_FOUND"


class DuplicateResourceError(BrokerError):
    """A request illegally referred to the same resource twice."""

    error_code, name = 92, "DUPLICATE_RESOURCE"


class UnacceptableCredentialError(BrokerError):
    """Requested credential would not meet criteria for acceptability."""

    error_code, name = 93, "UNACCEPTABLE_CREDENTIAL"


class InconsistentVoterSetError(BrokerError):
    """Indicates that the either the sender or recipient of a voter-only request is not one
    of the expected voters."""

    error_code, name = 94, "INCONSISTENT_VOTER_SET"


class InvalidUpdateVersionError(BrokerError):
    """The given update version was invalid."""

    error_code, name = 95, "INVALID_UPDATE_VERSION"


class FeatureUpdateFailedError(BrokerError):
    """Unable to update finalized features due to an unexpected server error."""

    error_code, name = 96, "FEATURE_UPDATE_FAILED"


class PrincipalDeserializationFailureError(BrokerError):
    """Request principal deserialization failed during forwarding."""

    error_code, name = 97, "PRINCIPAL_DESERIALIZATION_FAILURE"


class SnapshotNotFoundError(BrokerError):
    """Requested snapshot was not found."""

    error_code, name = 98, "SNAPSHOT_NOT_FOUND"


class PositionOutOfRangeError(BrokerError):
    """Requested position is not greater than or equal to zero, and less than the size of
    the snapshot."""

    error_code, name = 99, "POSITION_OUT_OF_RANGE"


class UnknownTopicIdError(BrokerError, UnknownTopicError, RefreshRetriableError):
    """This server does not host this topic ID."""

    error_code, name = 100, "UNKNOWN_TOPIC_ID"
    refresh_metadata = True


class DuplicateBrokerRegistrationError(BrokerError):
    """This broker ID is already in use."""

    error_code, name = 101, "DUPLICATE_BROKER_REGISTRATION"


class BrokerIdNotRegisteredError(BrokerError):
    """The given broker ID was not registered."""

    error_code, name = 102, "BROKER_ID_NOT_REGISTERED"


class InconsistentTopicIdError(BrokerError, RetriableError):
    """The log's topic ID did not match the topic ID in the request."""

    error_code, name = 103, "INCONSISTENT_TOPIC_ID"


class InconsistentClusterIdError(BrokerError):
    """The clusterId in the request does not match that found on the server."""

    error_code, name = 104, "INCONSISTENT_CLUSTER_ID"


class TransactionalIdNotFoundError(BrokerError):
    """The transactionalId could not be found."""

    error_code, name = 105, "TRANSACTIONAL_ID_NOT_FOUND"


class FetchSessionTopicIdErrorError(BrokerError, RetriableError):
    """The fetch session encountered inconsistent topic ID usage."""

    error_code, name = 106, "FETCH_SESSION_TOPIC_ID_ERROR"


class IneligibleReplicaError(BrokerError):
    """The new ISR contains at least one ineligible replica."""

    error_code, name = 107, "INELIGIBLE_REPLICA"


class NewLeaderElectedError(BrokerError):
    """The AlterPartition request successfully updated the partition state but the leader
    has changed."""

    error_code, name = 108, "NEW_LEADER_ELECTED"


class OffsetMovedToTieredStorageError(BrokerError):
    """The requested offset is moved to tiered storage."""

    error_code, name = 109, "OFFSET_MOVED_TO_TIERED_STORAGE"


class FencedMemberEpochError(BrokerError):
    """The member epoch is fenced by the group coordinator. The member must abandon all its
    partitions and rejoin."""

    error_code, name = 110, "FENCED_MEMBER_EPOCH"


class UnreleasedInstanceIdError(BrokerError):
    """The instance ID is still used by another member in the consumer group. That member
    must leave first."""

    error_code, name = 111, "UNRELEASED_INSTANCE_ID"


class UnsupportedAssignorError(BrokerError):
    """The assignor or its version range is not supported by the consumer group."""

    error_code, name = 112, "UNSUPPORTED_ASSIGNOR"


class StaleMemberEpochError(BrokerError):
    """The member epoch is stale. The member must retry after receiving its updated member
    epoch via the ConsumerGroupHeartbeat API."""

    error_code, name = 113, "STALE_MEMBER_EPOCH"


class MismatchedEndpointTypeError(BrokerError):
    """The request was sent to an endpoint of the wrong type."""

    error_code, name = 114, "MISMATCHED_ENDPOINT_TYPE"


class UnsupportedEndpointTypeError(BrokerError):
    """This endpoint type is not supported yet."""

    error_code, name = 115, "UNSUPPORTED_ENDPOINT_TYPE"


class UnknownControllerIdError(BrokerError):
    """This controller ID is not known."""

    error_code, name = 116, "UNKNOWN_CONTROLLER_ID"


class UnknownSubscriptionIdError(BrokerError):
    """Client sent a push telemetry request with an invalid or outdated subscription ID."""

    error_code, name = 117, "UNKNOWN_SUBSCRIPTION_ID"


class TelemetryTooLargeError(BrokerError):
    """Client sent a push telemetry request larger than the maximum size the broker will
    accept."""

    error_code, name = 118, "TELEMETRY_TOO_LARGE"


class InvalidRegistrationError(BrokerError):
    """The controller has considered the broker registration to be invalid."""

    error_code, name = 119, "INVALID_REGISTRATION"


class TransactionAbortableError(BrokerError, AbortableError):
    """The server encountered an error with the transaction. The client can abort the
    transaction to continue using this transactional ID."""

    error_code, name = 120, "TRANSACTION_ABORTABLE"


class InvalidRecordStateError(BrokerError):
    """The record state is invalid. The acknowledgement of delivery could not be completed."""

    error_code, name = 121, "INVALID_RECORD_STATE"


class ShareSessionNotFoundError(BrokerError, RetriableError):
    """The share session was not found."""

    error_code, name = 122, "SHARE_SESSION_NOT_FOUND"


class InvalidShareSessionEpochError(BrokerError, RetriableError):
    """The share session epoch is invalid."""

    error_code, name = 123, "INVALID_SHARE_SESSION_EPOCH"


class FencedStateEpochError(BrokerError):
    """The share coordinator rejected the request because the share-group state epoch did
    not match."""

    error_code, name = 124, "FENCED_STATE_EPOCH"


class InvalidVoterKeyError(BrokerError):
    """The voter key doesn't match the receiving replica's key."""

    error_code, name = 125, "INVALID_VOTER_KEY"


class DuplicateVoterError(BrokerError):
    """The voter is already part of the set of voters."""

    error_code, name = 126, "DUPLICATE_VOTER"


class VoterNotFoundError(BrokerError):
    """The voter is not part of the set of voters."""

    error_code, name = 127, "VOTER_NOT_FOUND"


class InvalidRegularExpressionError(BrokerError):
    """The regular expression is not valid."""

    error_code, name = 128, "INVALID_REGULAR_EXPRESSION"


class RebootstrapRequiredError(BrokerError, RetriableError):
    """Client metadata is stale. The client should rebootstrap to obtain new metadata."""

    error_code, name = 129, "REBOOTSTRAP_REQUIRED"


class ErrorClass(enum.Enum):
    """KIP-1050's classes of the errors a transactional call can meet (the table above)."""

    RETRIABLE = "retriable"
    REFRESH_RETRIABLE = "refresh and retry"
    ABORTABLE = "abortable"
    APPLICATION_RECOVERABLE = "application-recoverable"
    INVALID_CONFIGURATION = "invalid configuration"
    FATAL = "fatal"


_CLASS_BASES = (  # the first that matches decides (an error is of one class only)
    (InvalidConfigurationError, ErrorClass.INVALID_CONFIGURATION),
    (ApplicationRecoverableError, ErrorClass.APPLICATION_RECOVERABLE),
    (FatalError, ErrorClass.FATAL),
    (AbortableError, ErrorClass.ABORTABLE),
    (RefreshRetriableError, ErrorClass.REFRESH_RETRIABLE),
    (RetriableError, ErrorClass.RETRIABLE),
)


def error_class(exc: BaseException) -> ErrorClass:
    """The KIP-1050 class of an error a transactional call raised, or a record of a
    transaction failed with. Any other error (a record too large, say) fails its transaction:
    abortable; an error with `fatal` set by the producer (a TransactionStateError after a
    fatal error) is fatal."""
    for base, cls in _CLASS_BASES:
        if isinstance(exc, base):
            return cls
    if isinstance(exc, KafkaError) and exc.fatal:
        return ErrorClass.FATAL
    return ErrorClass.ABORTABLE


def error_for_code(code: int, message: str | None = None) -> BrokerError:
    """The exception for a Kafka error code (a generic BrokerError for codes we don't know)."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        exc = BrokerError(f"{message + ': ' if message else ''}error code {code}, unknown to "
                          "this client")
        exc.error_code = code
        return exc
    return cls(message)
