"""Keys and values laid out as Arrow lays out a binary column, by hand (no pyarrow), for the
speed-up's Columns."""

from __future__ import annotations

import array
import random


def binary_column(rng: random.Random, cells: list[bytes | None], first: int,
                  offset_size: int) -> tuple:
    """`cells` as (validity, offsets, data, first, offset_size): `first` rows before them and
    some after (a slice of a longer array), data before the first offset, null cells that
    span bytes (Arrow allows that), a validity bitmap when some cell is null (sometimes when
    none is)."""
    rows = [rng.randbytes(3) for _ in range(first)] + cells + [b"after"] * rng.randrange(0, 3)
    data = bytearray(rng.randbytes(rng.randrange(0, 5)))
    offsets = [len(data)]
    for cell in rows:
        data += rng.choice([b"", b"null's junk"]) if cell is None else cell
        offsets.append(len(data))
    validity = None
    if None in rows or rng.random() < 0.3:
        bits = bytearray(b"\xff" * ((len(rows) + 7) // 8))  # (bits past the rows: set)
        for i, cell in enumerate(rows):
            if cell is None:
                bits[i >> 3] &= ~(1 << (i & 7))
        validity = bytes(bits)
    layout = "i" if offset_size == 4 else "q"
    assert array.array(layout).itemsize == offset_size
    return validity, array.array(layout, offsets).tobytes(), bytes(data), first, offset_size


def columns_of(columns_type: type, rng: random.Random, pairs: list, keyless: bool = False):
    """`pairs` ((key, value) of bytes or None) as a `columns_type` (an implementation's
    Columns), each column a slice with 4- or 8-byte offsets; no key column if `keyless`."""
    keys = None if keyless else binary_column(rng, [k for k, _ in pairs], rng.randrange(0, 9),
                                              rng.choice([4, 8]))
    values = binary_column(rng, [v for _, v in pairs], rng.randrange(0, 9), rng.choice([4, 8]))
    return columns_type(len(pairs), keys, values)
