"""Serializers that know the record's topic and headers: `key_serializer=` or
`value_serializer=` an instance of a `Serializer` subclass, in place of a plain
`(obj) -> bytes` callable (which keeps working as before).

A base class, not a guess from the signature: a callable's parameters do not say reliably
what it takes (functools.partial, builtins, *args, defaults), and a class says it to type
checkers too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Awaitable, Callable, Generic, TypeVar, Union

T = TypeVar("T", contravariant=True)

# The record's headers as a serializer sees them: a list it may change (append a schema id
# or a trace id); what it holds after serialization is what the record carries.
MutableHeaders = list[tuple[str, bytes | None]]


class Serializer(ABC, Generic[T]):
    """Turns a key or value into bytes, knowing the record's topic and headers. Generic in
    what it takes (`Serializer[Order]`; a plain subclass takes Any): Producer's send() is
    typed from it.

    `serialize` may be a coroutine function (or return an awaitable): `send()` and
    `enqueue()` then await it before buffering the record, so two `enqueue()` calls in a row
    keep their order. A failure, or a result that is not bytes, raises SerializationError
    naming the topic, and the record is not buffered. Keys and values that are None are
    not passed to it (they stay null)."""

    @abstractmethod
    def serialize(self, topic: str, headers: MutableHeaders, value: T
                  ) -> bytes | Awaitable[bytes]:
        """The bytes of `value` for `topic` (the key's, as key_serializer); may add to
        `headers`."""


# What key_serializer and value_serializer take: a Serializer, or a plain callable of the
# key or value alone (which may be async too).
SerializerSetting = Union[Serializer[Any], Callable[[Any], Union[bytes, Awaitable[bytes]]]]
# One that takes T: what types a Producer's keys or values (see Producer.__init__).
SerializerOf = Union[Serializer[T], Callable[[T], Union[bytes, Awaitable[bytes]]]]
