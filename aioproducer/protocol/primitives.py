"""Kafka's primitive types, and a small schema language compiled into encoders/decoders.

A message is a list of `Field`s, each valid for a range of versions, as in Kafka's JSON message
definitions. "Flexible" versions (KIP-482) use compact (varint-length) strings, bytes and
arrays, and end every struct with a tagged-field section; we write empty tag sections and skip
the tags we read. A schema is compiled once per (message, version, flexible) into a tuple of
closures, so encoding a request walks no schema metadata.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import CorruptMessageError

_INT = {
    "int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"), "uint16": struct.Struct(">H"), "float64": struct.Struct(">d"),
}


def encode_uvarint(n: int) -> bytes:
    """Unsigned varint (compact lengths, tag counts)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    """Zigzag varint (signed), as RecordBatch v2 records use."""
    return encode_uvarint((n << 1) ^ (n >> 63))


class Reader:
    """Reads primitives from a frame; any overrun is a CorruptMessageError."""

    __slots__ = ("data", "position")

    def __init__(self, data: bytes | memoryview, position: int = 0) -> None:
        self.data = data
        self.position = position

    def fixed(self, st: struct.Struct) -> Any:
        try:
            (value,) = st.unpack_from(self.data, self.position)
        except struct.error:
            raise CorruptMessageError("the frame ends in the middle of a field") from None
        self.position += st.size
        return value

    def uvarint(self) -> int:
        shift = result = 0
        data = self.data
        while True:
            if self.position >= len(data):
                raise CorruptMessageError("the frame ends in the middle of a varint")
            byte = data[self.position]
            self.position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise CorruptMessageError("a varint is longer than 10 bytes")

    def raw(self, length: int) -> bytes:
        end = self.position + length
        if length < 0 or end > len(self.data):
            raise CorruptMessageError("a field is longer than its frame")
        chunk = bytes(self.data[self.position:end])
        self.position = end
        return chunk

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.raw(self.uvarint())


@dataclass(frozen=True)
class Field:
    """One field: `kind` is a primitive name, "[kind]" for an array of primitives, or a
    tuple of Fields for an array of structs."""

    name: str
    kind: str | tuple["Field", ...]
    versions: tuple[int, int] = (0, 99)
    nullable_from: int = 99  # the first version where null is allowed
    default: Any = None


Writer = Callable[[list, Any], None]
ReaderFn = Callable[[Reader], Any]


def compile_writer(fields: Sequence[Field], version: int, flexible: bool) -> Writer:
    """A function that appends the encoding of a dict (missing keys: defaults) to a list."""
    steps: list[tuple[str, Writer, Any]] = []
    for f in fields:
        if not f.versions[0] <= version <= f.versions[1]:
            continue
        steps.append((f.name, _field_writer(f, version, flexible), _default(f, version)))

    def write(out: list, value: Any) -> None:
        get = value.get
        for name, writer, default in steps:
            item = get(name, default)
            writer(out, item)
        if flexible:
            out.append(b"\x00")
    return write


def _default(f: Field, version: int) -> Any:
    if f.default is not None:
        return f.default
    if version >= f.nullable_from:
        return None
    if isinstance(f.kind, tuple) or f.kind.startswith("["):
        return []
    return {"string": "", "bytes": b"", "records": b"", "bool": False,
            "uuid": uuid.UUID(int=0)}.get(f.kind, 0)


def _field_writer(f: Field, version: int, flexible: bool) -> Writer:
    nullable = version >= f.nullable_from
    kind = f.kind
    if isinstance(kind, tuple):
        return _array_writer(compile_writer(kind, version, flexible), flexible, nullable, f.name)
    if kind.startswith("["):
        return _array_writer(_primitive_writer(kind[1:-1], flexible, False, f.name),
                             flexible, nullable, f.name)
    return _primitive_writer(kind, flexible, nullable, f.name)


def _array_writer(item: Writer, flexible: bool, nullable: bool, name: str) -> Writer:
    int32 = _INT["int32"]

    def write(out: list, values: Any) -> None:
        if values is None:
            if not nullable:
                raise ValueError(f"{name} may not be null in this version")
            out.append(encode_uvarint(0) if flexible else int32.pack(-1))
            return
        out.append(encode_uvarint(len(values) + 1) if flexible else int32.pack(len(values)))
        for v in values:
            item(out, v)
    return write


def _primitive_writer(kind: str, flexible: bool, nullable: bool, name: str) -> Writer:
    if kind in _INT:
        pack = _INT[kind].pack
        return lambda out, v: out.append(pack(v))
    if kind == "bool":
        return lambda out, v: out.append(b"\x01" if v else b"\x00")
    if kind == "uuid":
        return lambda out, v: out.append((v or uuid.UUID(int=0)).bytes)
    if kind in ("string", "bytes", "records"):
        is_text = kind == "string"
        length_struct = _INT["int16" if is_text else "int32"]

        def write(out: list, v: Any) -> None:
            if v is None:
                if not nullable and kind != "records":
                    raise ValueError(f"{name} may not be null in this version")
                out.append(encode_uvarint(0) if flexible else length_struct.pack(-1))
                return
            data = v.encode() if is_text else v
            out.append(encode_uvarint(len(data) + 1) if flexible else length_struct.pack(len(data)))
            out.append(data)
        return write
    raise ValueError(f"unknown field type {kind!r}")


def compile_reader(fields: Sequence[Field], version: int, flexible: bool) -> ReaderFn:
    """A function that reads a struct into a dict with every field valid in `version`."""
    steps = [(f.name, _field_reader(f, version, flexible))
             for f in fields if f.versions[0] <= version <= f.versions[1]]

    def read(reader: Reader) -> dict[str, Any]:
        result = {name: fn(reader) for name, fn in steps}
        if flexible:
            reader.skip_tags()
        return result
    return read


def _field_reader(f: Field, version: int, flexible: bool) -> ReaderFn:
    kind = f.kind
    if isinstance(kind, tuple):
        return _array_reader(compile_reader(kind, version, flexible), flexible)
    if kind.startswith("["):
        return _array_reader(_primitive_reader(kind[1:-1], flexible), flexible)
    return _primitive_reader(kind, flexible)


def _array_reader(item: ReaderFn, flexible: bool) -> ReaderFn:
    int32 = _INT["int32"]

    def read(reader: Reader) -> list | None:
        n = reader.uvarint() - 1 if flexible else reader.fixed(int32)
        if n < 0:
            return None
        if n > len(reader.data) - reader.position:
            raise CorruptMessageError(f"an array claims {n} items, more than the frame holds")
        return [item(reader) for _ in range(n)]
    return read


def _primitive_reader(kind: str, flexible: bool) -> ReaderFn:
    if kind in _INT:
        st = _INT[kind]
        return lambda r: r.fixed(st)
    if kind == "bool":
        int8 = _INT["int8"]
        return lambda r: r.fixed(int8) != 0
    if kind == "uuid":
        return lambda r: uuid.UUID(bytes=r.raw(16))
    if kind in ("string", "bytes", "records"):
        length_struct = _INT["int16" if kind == "string" else "int32"]

        def read(r: Reader) -> Any:
            n = r.uvarint() - 1 if flexible else r.fixed(length_struct)
            if n < 0:
                return None
            data = r.raw(n)
            if kind != "string":
                return data
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise CorruptMessageError("a string field is not UTF-8") from None
        return read
    raise ValueError(f"unknown field type {kind!r}")
