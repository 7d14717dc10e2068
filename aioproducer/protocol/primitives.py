"""Kafka's primitive types, and a small schema language compiled into encoders/decoders.

A message is a list of `Field`s, each valid for a range of versions, as in Kafka's JSON message
definitions. "Flexible" versions (KIP-482) use compact (varint-length) strings, bytes and
arrays, and end every struct with a tagged-field section; we write empty tag sections, and read
the tagged fields a schema names (KIP-951's new leader in a produce response), skipping the
rest. A schema is turned once per (message, version, flexible) into Python source,
straight-line code with no call per field, and compiled: encoding a request walks no schema
metadata, and a request encoded on a cold CPU (a service that sends now and then) pays for
few calls.
"""

from __future__ import annotations

import struct
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
    """Reads a frame where the generated readers leave off (varints longer than a byte,
    tagged fields); any overrun is a CorruptMessageError."""

    __slots__ = ("data", "position")

    def __init__(self, data: bytes | memoryview, position: int = 0) -> None:
        self.data = data
        self.position = position

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
    tuple of Fields for an array of structs (one struct when `array` is False). A field with
    a `tag` lives in the struct's tagged-field section (flexible versions only): in the
    dict when the section holds it, absent when not; never written."""

    name: str
    kind: str | tuple["Field", ...]
    versions: tuple[int, int] = (0, 99)
    nullable_from: int = 99  # the first version where null is allowed
    default: Any = None
    tag: int | None = None
    array: bool = True
    max_items: int | None = None  # an array's bound: a response claiming more is corrupt


Writer = Callable[[list[Any], Any], None]
ReaderFn = Callable[[bytes | memoryview, int], Any]

# A "uuid" (KIP-516's topic ids, KIP-714's client instance ids) is its 16 bytes, as on the
# wire: a uuid.UUID costs ~1 us to make from a response and to read back, once per topic of
# every Produce v13 request and answer; only what a person reads (a log) makes one.
_ZERO_UUID = bytes(16)
_LENGTH = {"string": "int16", "bytes": "int32", "records": "int32"}  # non-compact prefixes


class _Source:
    """Python source of a codec being generated, and the objects its names stand for."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"CorruptMessageError": CorruptMessageError,
                                      "uvarint": encode_uvarint}
        self._count = 0

    def var(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def bind(self, prefix: str, obj: Any) -> str:
        """A global of the generated code that stands for `obj`."""
        name = self.var(prefix)
        self.names[name] = obj
        return name

    def literal(self, obj: Any) -> str:
        return repr(obj) if obj is None or isinstance(obj, (bool, int, str, bytes)) else \
            self.bind("default", obj)

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def compile(self, function: str, label: str) -> Any:
        # The source is made only from our own message schemas, never from input.
        exec(compile("\n".join(self.lines), f"<kafka codec: {label}>", "exec"), self.names)  # noqa: S102
        return self.names[function]


def compile_writer(fields: Sequence[Field], version: int, flexible: bool) -> Writer:
    """A function that appends the encoding of a dict (missing keys: defaults) to a list."""
    src = _Source()
    src.emit(0, "def write(out, value):")
    src.emit(1, "append = out.append")
    _write_struct(src, fields, version, flexible, "value", 1)
    return src.compile("write", f"writer v{version}")  # type: ignore[no-any-return]


def _write_struct(src: _Source, fields: Sequence[Field], version: int, flexible: bool,
                  var: str, depth: int) -> None:
    get = src.var("get")
    src.emit(depth, f"{get} = {var}.get")
    for f in fields:
        if f.versions[0] <= version <= f.versions[1] and f.tag is None:
            item = src.var("v")
            src.emit(depth, f"{item} = {get}({f.name!r}, {src.literal(_default(f, version))})")
            _write_field(src, f.name, f.kind, version >= f.nullable_from, version, flexible,
                         item, depth)
    if flexible:
        src.emit(depth, "append(b'\\x00')")  # no tagged fields


def _write_field(src: _Source, name: str, kind: str | tuple[Field, ...], nullable: bool,
                 version: int, flexible: bool, item: str, depth: int) -> None:
    is_array = isinstance(kind, tuple) or kind.startswith("[")
    if is_array or kind in _LENGTH:  # nullable types
        src.emit(depth, f"if {item} is None:")
        if not nullable and kind != "records":
            src.emit(depth + 1, f"raise ValueError({name + ' may not be null in this version'!r})")
        else:
            null = b"\x00" if flexible else _INT[_length_kind(kind)].pack(-1)
            src.emit(depth + 1, f"append({null!r})")
        src.emit(depth, "else:")
        depth += 1
    if is_array:
        src.emit(depth, f"append(uvarint(len({item}) + 1))" if flexible else
                 f"append({src.bind('int32', _INT['int32'].pack)}(len({item})))")
        element = src.var("x")
        src.emit(depth, f"for {element} in {item}:")
        if isinstance(kind, tuple):
            _write_struct(src, kind, version, flexible, element, depth + 1)
        else:
            _write_field(src, name, kind[1:-1], False, version, flexible, element, depth + 1)
    elif kind in _LENGTH:
        data = item
        if kind == "string":
            data = src.var("data")
            src.emit(depth, f"{data} = {item}.encode()")
        length = "append(uvarint({} + 1))" if flexible else \
            f"append({src.bind(_LENGTH[kind], _INT[_LENGTH[kind]].pack)}({{}}))"
        if kind == "records":  # bytes, or a batch's (header, payload) as the sender gives it:
            # both appended where they lie (encode_request keeps a large payload uncopied)
            src.emit(depth, f"if type({item}) is tuple:")
            src.emit(depth + 1, f"head, payload = {item}")
            src.emit(depth + 1, length.format("len(head) + len(payload)"))
            src.emit(depth + 1, "append(head)")
            src.emit(depth + 1, "append(payload)")
            src.emit(depth, "else:")
            depth += 1
        src.emit(depth, length.format(f"len({data})"))
        src.emit(depth, f"append({data})")
    elif kind in _INT:
        src.emit(depth, f"append({src.bind(kind, _INT[kind].pack)}({item}))")
    elif kind == "bool":
        src.emit(depth, f"append(b'\\x01' if {item} else b'\\x00')")
    elif kind == "uuid":  # its 16 bytes, a bytes object (None: the zero id, "none")
        src.emit(depth, f"if {item} is None:")
        src.emit(depth + 1, f"append({_ZERO_UUID!r})")
        src.emit(depth, f"elif type({item}) is bytes and len({item}) == 16:")
        src.emit(depth + 1, f"append({item})")
        src.emit(depth, "else:")
        message = f"{name} is a uuid: 16 bytes, not {{{item}!r:.60}}"
        src.emit(depth + 1, f"raise ValueError(f{message!r})")
    else:
        raise ValueError(f"unknown field type {kind!r}")


def _length_kind(kind: str | tuple[Field, ...]) -> str:
    """The integer before a string, bytes or array in non-flexible versions."""
    return _LENGTH[kind] if isinstance(kind, str) and kind in _LENGTH else "int32"


def _default(f: Field, version: int) -> Any:
    if f.default is not None:
        return f.default
    if version >= f.nullable_from:
        return None
    if isinstance(f.kind, tuple) or f.kind.startswith("["):
        return []
    return {"string": "", "bytes": b"", "records": b"", "bool": False,
            "uuid": _ZERO_UUID}.get(f.kind, 0)


def compile_reader(fields: Sequence[Field], version: int, flexible: bool) -> ReaderFn:
    """A function `(data, pos)` that reads a struct into a dict with every field valid in
    `version`. The generated code reads from local `data` and `pos`, one-byte varints (the
    common case) inline; running off the end of the frame is a CorruptMessageError."""
    src = _Source()
    src.names.update(uvarint_at=_uvarint_at, skip_tags=skip_tags, read_tags=_read_tags,
                     struct_error=struct.error)
    function = _read_struct(src, fields, version, flexible)
    src.emit(0, "def read(data, pos):")
    src.emit(1, "try:")
    src.emit(2, f"body, _ = {function}(data, pos)")
    src.emit(1, "except (IndexError, struct_error):")
    src.emit(2, "raise CorruptMessageError('the frame ends in the middle of a field') from None")
    src.emit(1, "return body")
    return src.compile("read", f"reader v{version}")  # type: ignore[no-any-return]


def _read_struct(src: _Source, fields: Sequence[Field], version: int, flexible: bool) -> str:
    """Emits a function `(data, pos) -> (dict, pos)` for one struct (nested structs first);
    returns its name."""
    present = [f for f in fields if f.versions[0] <= version <= f.versions[1]
               and (f.tag is None or flexible)]
    nested = {f.name: _read_struct(src, f.kind, version, flexible)
              for f in present if isinstance(f.kind, tuple)}
    tagged = {f.tag: (f.name, _read_tagged(src, f, nested.get(f.name), flexible))
              for f in present if f.tag is not None}
    function = src.var("read_struct")
    src.emit(0, f"def {function}(data, pos):")
    items = []
    for f in present:
        if f.tag is None:
            item = src.var("v")
            _read_field(src, f.kind, nested.get(f.name), flexible, item, 1,
                        f.name, version >= f.nullable_from, f.max_items)
            items.append(f"{f.name!r}: {item}")
    if tagged:
        # Built only when the section is not empty (rare: a produce response names a new
        # leader), from the names of the generated readers.
        values = src.var("tagged")
        readers = ", ".join(f"{tag}: ({name!r}, {reader})"
                            for tag, (name, reader) in tagged.items())
        src.emit(1, "if data[pos]:")
        src.emit(2, f"{values}, pos = read_tags(data, pos, {{{readers}}})")
        src.emit(1, "else:")
        src.emit(2, f"{values} = {{}}")
        src.emit(2, "pos += 1")
        items.append(f"**{values}")
    elif flexible:
        src.emit(1, "if data[pos]:")
        src.emit(2, "pos = skip_tags(data, pos)")
        src.emit(1, "else:")
        src.emit(2, "pos += 1")
    src.emit(1, f"return {{{', '.join(items)}}}, pos")
    return function


def _read_tagged(src: _Source, f: Field, struct_reader: str | None, flexible: bool) -> str:
    """The name of a generated function `(data, pos) -> (value, pos)` for a tagged field's
    value."""
    if struct_reader is not None and not f.array:
        return struct_reader
    function = src.var("read_tagged")
    src.emit(0, f"def {function}(data, pos):")
    item = src.var("v")
    _read_field(src, f.kind, struct_reader, flexible, item, 1, f.name,
                f.nullable_from < 99)
    src.emit(1, f"return {item}, pos")
    return function


def _read_field(src: _Source, kind: str | tuple[Field, ...], struct_reader: str | None,
                flexible: bool, item: str, depth: int, name: str, nullable: bool,
                max_items: int | None = None) -> None:
    """Reads one field into local `item`. A negative length where the schema allows no null
    is a CorruptMessageError, as in Kafka's own readers (not a None that fails later), and
    so is an array longer than its field's bound."""
    is_array = isinstance(kind, tuple) or kind.startswith("[")
    if is_array or kind in _LENGTH:
        count = src.var("n")
        if flexible:
            src.emit(depth, f"{count} = data[pos]")
            src.emit(depth, f"if {count} < 0x80:")
            src.emit(depth + 1, "pos += 1")
            src.emit(depth, "else:")
            src.emit(depth + 1, f"{count}, pos = uvarint_at(data, pos)")
            src.emit(depth, f"{count} -= 1")
        else:
            length = _INT[_length_kind(kind)]
            src.emit(depth, f"({count},) = {src.bind('length', length.unpack_from)}(data, pos)")
            src.emit(depth, f"pos += {length.size}")
        src.emit(depth, f"if {count} < 0:")
        if nullable or kind == "records":
            src.emit(depth + 1, f"{item} = None")
        else:
            src.emit(depth + 1, "raise CorruptMessageError("
                                f"{'non-nullable field ' + name + ' is null (a negative length)'!r})")
        src.emit(depth, "else:")
        depth += 1
        if is_array:
            src.emit(depth, f"if {count} > len(data) - pos:")
            src.emit(depth + 1, "raise CorruptMessageError("
                                f"f'an array claims {{{count}}} items, more than the frame holds')")
            if max_items is not None:
                src.emit(depth, f"if {count} > {max_items}:")
                src.emit(depth + 1, "raise CorruptMessageError("
                                    f"f'{name} claims {{{count}}} items, more than the "
                                    f"{max_items} any Kafka cluster has')")
            element = src.var("x")
            src.emit(depth, f"{item} = []")
            src.emit(depth, f"for _ in range({count}):")
            if isinstance(kind, tuple):
                src.emit(depth + 1, f"{element}, pos = {struct_reader}(data, pos)")
            else:
                _read_field(src, kind[1:-1], None, flexible, element, depth + 1, name, False)
            src.emit(depth + 1, f"{item}.append({element})")
        else:
            src.emit(depth, f"if pos + {count} > len(data):")
            src.emit(depth + 1, "raise CorruptMessageError('a field is longer than its frame')")
            src.emit(depth, f"{item} = bytes(data[pos:pos + {count}])")
            src.emit(depth, f"pos += {count}")
            if kind == "string":
                src.emit(depth, "try:")
                src.emit(depth + 1, f"{item} = {item}.decode()")
                src.emit(depth, "except UnicodeDecodeError:")
                src.emit(depth + 1, "raise CorruptMessageError('a string field is not UTF-8') from None")
    elif kind in _INT or kind == "bool":
        st = _INT["int8" if kind == "bool" else kind]
        src.emit(depth, f"({item},) = {src.bind(kind, st.unpack_from)}(data, pos)")
        src.emit(depth, f"pos += {st.size}")
        if kind == "bool":
            src.emit(depth, f"{item} = {item} != 0")
    elif kind == "uuid":
        src.emit(depth, "if pos + 16 > len(data):")
        src.emit(depth + 1, "raise CorruptMessageError('a field is longer than its frame')")
        src.emit(depth, f"{item} = bytes(data[pos:pos + 16])")
        src.emit(depth, "pos += 16")
    else:
        raise ValueError(f"unknown field type {kind!r}")


def _uvarint_at(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    reader = Reader(data, pos)
    return reader.uvarint(), reader.position


def _read_tags(data: bytes | memoryview, pos: int,
               readers: dict[int, tuple[str, ReaderFn]]) -> tuple[dict[str, Any], int]:
    """The tagged fields at `pos` that `readers` knows, by name, and the position after the
    section; unknown tags are skipped, as KIP-482 requires."""
    reader = Reader(data, pos)
    values = {}
    for _ in range(reader.uvarint()):
        tag = reader.uvarint()
        size = reader.uvarint()
        start, end = reader.position, reader.position + size
        if end > len(data):
            raise CorruptMessageError("a tagged field is longer than its frame")
        known = readers.get(tag)
        if known is not None:
            name, read = known
            values[name], read_to = read(data, start)
            if read_to != end:
                raise CorruptMessageError(f"tagged field {name!r} is not {size} bytes long")
        reader.position = end
    return values, reader.position


def skip_tags(data: bytes | memoryview, pos: int) -> int:
    """The position after the tagged-field section at `pos` (KIP-482), usually empty."""
    if pos < len(data) and data[pos] == 0:
        return pos + 1
    reader = Reader(data, pos)
    reader.skip_tags()
    return reader.position
