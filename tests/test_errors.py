"""The error table and the transaction state table, broker-free: what the flags on an error
tell a caller (and the producer) to do, and that a call refused for the transaction's state
says so in its flags."""

from __future__ import annotations

import pickle

import pytest

from aioproducer.client.cluster import Cluster
from aioproducer.client.tasks import TaskSet
from aioproducer.config import ProducerConfig
from aioproducer.errors import (
    ERROR_CLASSES,
    AbortableError,
    ApplicationRecoverableError,
    ConfigError,
    DeliveryTimeoutError,
    ErrorClass,
    FatalError,
    InvalidConfigurationError,
    KafkaConnectionError,
    ProducerFailedError,
    ProducerFencedError,
    RecordTooLargeError,
    RefreshRetriableError,
    TransactionFailedError,
    TransactionStateError,
    error_class,
    error_for_code,
)
from aioproducer._internal.transactions import TransactionManager, TxnState


def test_the_errors_that_make_the_producer_look_up_leaders_again():
    """As the Java client's InvalidMetadataException family: the answers that say our
    knowledge of a partition's leader is stale, and only those."""
    refreshing = {cls.name for cls in ERROR_CLASSES.values() if cls.refresh_metadata}
    assert refreshing == {
        "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE", "NOT_LEADER_OR_FOLLOWER",
        "REPLICA_NOT_AVAILABLE", "NETWORK_EXCEPTION", "KAFKA_STORAGE_ERROR",
        "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
        "UNKNOWN_TOPIC_ID"}  # (Produce v13+: the topic was deleted, perhaps made again)
    assert all(cls.retriable for cls in ERROR_CLASSES.values() if cls.refresh_metadata)
    assert not any(cls.retriable and cls.fatal for cls in ERROR_CLASSES.values())


async def _manager() -> TransactionManager:
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9", transactional_id="t")
    tasks = TaskSet()
    cluster = Cluster(config, tasks)
    txn = TransactionManager(config, cluster, tasks)
    return txn


async def test_a_failed_transaction_refuses_commit_with_an_abortable_error():
    txn = await _manager()
    txn.state = TxnState.READY  # (as init_transactions() leaves it)
    txn.begin()
    failure = KafkaConnectionError("the record's request was lost")
    txn.abortable(failure)
    assert txn.state is TxnState.ABORTABLE_ERROR
    for refused in (txn.check_can_send, lambda: txn.start_commit_or_abort(commit=True),
                    txn.begin):
        with pytest.raises(TransactionStateError, match="abort") as caught:
            refused()
        assert caught.value.abortable and not caught.value.fatal
    with pytest.raises(TransactionStateError) as caught:
        txn.start_commit_or_abort(commit=True)
    assert caught.value.__cause__ is failure
    again = pickle.loads(pickle.dumps(caught.value))  # (Spark ships errors between processes)
    assert again.abortable and str(again) == str(caught.value)
    txn.start_commit_or_abort(commit=False)  # the abort is what is left
    assert txn.state is TxnState.ABORTING


@pytest.mark.parametrize("state", list(TxnState))
async def test_a_fatal_error_may_come_in_any_state_and_every_call_after_says_close(state):
    txn = await _manager()
    txn.state = state
    txn.fatal(KafkaConnectionError("the coordinator said something fatal"))
    assert txn.state is TxnState.FATAL_ERROR
    for refused in (txn.check_can_send, txn.begin, lambda: txn.start_commit_or_abort(False)):
        with pytest.raises(TransactionStateError, match="close it") as caught:
            refused()
        assert caught.value.fatal and not caught.value.abortable


async def test_a_fenced_producer_is_told_so_by_every_call():
    txn = await _manager()
    txn.state = TxnState.IN_TRANSACTION
    fenced = ProducerFencedError("another producer with transactional_id 't' has started")
    txn.fatal(fenced)
    with pytest.raises(ProducerFencedError) as caught:
        txn.check_can_send()
    assert caught.value is fenced and caught.value.fatal


async def test_calls_out_of_order_say_what_to_do_and_change_nothing():
    txn = await _manager()
    with pytest.raises(TransactionStateError, match=r"init_transactions\(\)") as caught:
        txn.begin()
    assert not caught.value.abortable and not caught.value.fatal
    txn.state = TxnState.READY
    with pytest.raises(TransactionStateError, match=r"begin_transaction\(\)"):
        txn.start_commit_or_abort(commit=True)
    assert txn.state is TxnState.READY


@pytest.mark.parametrize(("code", "expected"), [
    (51, ErrorClass.RETRIABLE),  # CONCURRENT_TRANSACTIONS
    (14, ErrorClass.RETRIABLE),  # COORDINATOR_LOAD_IN_PROGRESS
    (16, ErrorClass.REFRESH_RETRIABLE),  # NOT_COORDINATOR
    (15, ErrorClass.REFRESH_RETRIABLE),  # COORDINATOR_NOT_AVAILABLE
    (6, ErrorClass.REFRESH_RETRIABLE),  # NOT_LEADER_OR_FOLLOWER
    (120, ErrorClass.ABORTABLE),  # TRANSACTION_ABORTABLE (KIP-890)
    (47, ErrorClass.ABORTABLE),  # INVALID_PRODUCER_EPOCH from a Produce (KIP-588)
    (22, ErrorClass.ABORTABLE),  # ILLEGAL_GENERATION: a zombie's offsets
    (29, ErrorClass.ABORTABLE),  # TOPIC_AUTHORIZATION_FAILED: that topic, not the producer
    (90, ErrorClass.APPLICATION_RECOVERABLE),  # PRODUCER_FENCED
    (82, ErrorClass.APPLICATION_RECOVERABLE),  # FENCED_INSTANCE_ID
    (53, ErrorClass.INVALID_CONFIGURATION),  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    (31, ErrorClass.INVALID_CONFIGURATION),  # CLUSTER_AUTHORIZATION_FAILED
    (35, ErrorClass.INVALID_CONFIGURATION),  # UNSUPPORTED_VERSION
    (50, ErrorClass.INVALID_CONFIGURATION),  # INVALID_TRANSACTION_TIMEOUT
    (48, ErrorClass.FATAL),  # INVALID_TXN_STATE
    (52, ErrorClass.FATAL),  # TRANSACTION_COORDINATOR_FENCED
])
def test_kip1050_error_classes(code, expected):
    """Each error a transactional call can meet is of one KIP-1050 class, a base class to
    catch it by, with the flags that class implies."""
    exc = error_for_code(code)
    assert error_class(exc) is expected
    bases = {ErrorClass.REFRESH_RETRIABLE: RefreshRetriableError,
             ErrorClass.ABORTABLE: AbortableError,
             ErrorClass.APPLICATION_RECOVERABLE: ApplicationRecoverableError,
             ErrorClass.INVALID_CONFIGURATION: InvalidConfigurationError,
             ErrorClass.FATAL: FatalError}
    if expected in bases:
        assert isinstance(exc, bases[expected])
    assert exc.retriable is (expected in (ErrorClass.RETRIABLE, ErrorClass.REFRESH_RETRIABLE))
    assert exc.abortable is (expected is ErrorClass.ABORTABLE)
    assert exc.fatal is (expected in (ErrorClass.APPLICATION_RECOVERABLE,
                                      ErrorClass.INVALID_CONFIGURATION, ErrorClass.FATAL))


async def test_a_call_refused_for_the_state_is_typed_by_what_the_state_leaves_to_do():
    """After a failed record the refusal is a TransactionFailedError (abortable); after a
    fatal error a ProducerFailedError (fatal); our own errors have a class too (a timeout
    of a record inside a transaction, or any other failure of one, is abortable)."""
    txn = await _manager()
    txn.state = TxnState.READY
    txn.begin()
    txn.abortable(DeliveryTimeoutError("a record's delivery_timeout_ms passed"))
    with pytest.raises(TransactionFailedError) as failed:
        txn.check_can_send()
    assert error_class(failed.value) is ErrorClass.ABORTABLE
    txn.fatal(KafkaConnectionError("the coordinator said something fatal"))
    with pytest.raises(ProducerFailedError) as fatal:
        txn.begin()
    assert error_class(fatal.value) is ErrorClass.FATAL
    assert error_class(ConfigError("bad setting")) is ErrorClass.INVALID_CONFIGURATION
    assert error_class(RecordTooLargeError("too large")) is ErrorClass.ABORTABLE
