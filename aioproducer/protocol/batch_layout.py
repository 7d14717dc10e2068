"""The numbers of a RecordBatch v2's header, in one place for the writers (records.py, the
pure-Python speed-up _py.py) and the reader; the C speed-up (_c.c) writes the same layout.
https://kafka.apache.org/documentation/#recordbatch
"""

import struct

HEADER_SIZE = 61
# From base_offset to the record count: baseOffset, batchLength, partitionLeaderEpoch, magic,
# crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, records count.
HEADER = struct.Struct(">qiibIhiqqqhii")
CRC_FROM = 21  # the CRC covers attributes .. end
TRANSACTIONAL = 0x10  # attribute bits
CONTROL = 0x20
