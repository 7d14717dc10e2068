"""The per-record work of producing (the record encoder, murmur2, enqueue_many's loop and
the Arrow-layout columns it also reads, enqueue()'s append, a record's future: its fields,
metadata and the Future protocol asyncio calls on it), a batch's fields, the opening of a batch
(the accumulator's fields it touches), the codec of the one request every send waits for
(Produce), that request's partitions built from its batches, and its response's answers
matched to them and the batches acknowledged counted.

Compiled from _c.c when the package is built (an optional extension: installing never fails
for want of a compiler), else the pure-Python _py.py with the same interface and results.
AIOPRODUCER_PURE_PYTHON=1 forces the pure-Python one. `IMPLEMENTATION` says which is in use.
"""

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the C module has exactly _py's interface
    from ._py import (
        DONE, NEEDS_BATCH, NEEDS_PYTHON, AccumulatorFields, Appender, BatchFields, Columns,
        MemoryPool, Ready, RecordFields, RecordWriter, append_many, append_record,
        count_acked, decode_produce, encode_produce, murmur2, new_tuple, partition_for_key,
        produce_parts, run_callbacks, same_context, settle_produce, take_acked, watch_batches)
    IMPLEMENTATION: str
elif os.environ.get("AIOPRODUCER_PURE_PYTHON", "") not in ("", "0"):
    from ._py import (
        DONE, NEEDS_BATCH, NEEDS_PYTHON, AccumulatorFields, Appender, BatchFields, Columns,
        MemoryPool, Ready, RecordFields, RecordWriter, append_many, append_record,
        count_acked, decode_produce, encode_produce, murmur2, new_tuple, partition_for_key,
        produce_parts, run_callbacks, same_context, settle_produce, take_acked, watch_batches)
    IMPLEMENTATION = "python"
else:
    try:
        from ._c import (
            DONE, NEEDS_BATCH, NEEDS_PYTHON, AccumulatorFields, Appender, BatchFields, Columns,
            MemoryPool, Ready, RecordFields, RecordWriter, append_many, append_record,
            count_acked, decode_produce, encode_produce, murmur2, new_tuple, partition_for_key,
            produce_parts, run_callbacks, same_context, settle_produce, take_acked,
            watch_batches)
        IMPLEMENTATION = "c"
    except ImportError:
        from ._py import (
            DONE, NEEDS_BATCH, NEEDS_PYTHON, AccumulatorFields, Appender, BatchFields, Columns,
            MemoryPool, Ready, RecordFields, RecordWriter, append_many, append_record,
            count_acked, decode_produce, encode_produce, murmur2, new_tuple, partition_for_key,
            produce_parts, run_callbacks, same_context, settle_produce, take_acked,
            watch_batches)
        IMPLEMENTATION = "python"

__all__ = ["AccumulatorFields", "Appender", "BatchFields", "Columns", "DONE", "IMPLEMENTATION",
           "MemoryPool", "NEEDS_BATCH", "NEEDS_PYTHON", "Ready", "RecordFields", "RecordWriter",
           "append_many", "append_record", "decode_produce", "encode_produce", "murmur2",
           "new_tuple", "partition_for_key", "produce_parts", "run_callbacks", "same_context",
           "settle_produce", "take_acked", "count_acked", "watch_batches"]
