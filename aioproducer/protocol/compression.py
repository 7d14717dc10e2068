"""The four codecs of Kafka's RecordBatch v2, compressing a batch's records section.

- gzip: the stdlib's zlib, gzip framing.
- snappy: raw snappy blocks (via cramjam), as librdkafka writes them; Java's reader
  (snappy-java's SnappyInputStream) and kafka-python read raw snappy as well as the xerial
  framing the Java producer writes, and `decompress` here reads both too.
- lz4: the LZ4 frame format with independent blocks and no content size, the subset every
  Kafka reader accepts (Java's KafkaLZ4BlockInputStream refuses linked blocks).
- zstd: via zstandard; frames without a content size (as other clients write) decode too.
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam
import lz4.frame
import zstandard


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def codec_from_name(name: str) -> Codec:
    try:
        return Codec[name.upper()]
    except KeyError:
        raise ValueError(f"unknown compression {name!r}: use one of "
                         f"{', '.join(c.name.lower() for c in Codec)}") from None


def compress(codec: Codec, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    if codec == Codec.GZIP:
        compressor = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()
    if codec == Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if codec == Codec.LZ4:
        return bytes(lz4.frame.compress(bytes(data), block_linked=False, store_size=False,
                                        compression_level=level or 0))
    if codec == Codec.ZSTD:
        return zstandard.ZstdCompressor(level=3 if level is None else level).compress(bytes(data))
    return bytes(data)


def decompress(codec: Codec, data: bytes | memoryview) -> bytes:
    data = bytes(data)
    if codec == Codec.GZIP:
        return zlib.decompress(data, 47)  # gzip or zlib header
    if codec == Codec.SNAPPY:
        if data.startswith(_XERIAL_MAGIC):
            return _xerial_decompress(data)
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == Codec.LZ4:
        return bytes(lz4.frame.decompress(data))
    if codec == Codec.ZSTD:
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def _xerial_decompress(data: bytes) -> bytes:
    """snappy-java's stream: magic, two int32 versions, then (int32 length, raw block)*."""
    out = []
    position = 16
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position)
        position += 4
        out.append(bytes(cramjam.snappy.decompress_raw(data[position:position + length])))
        position += length
    return b"".join(out)
