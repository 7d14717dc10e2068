"""Exactly once, consume-transform-produce: the output records and the consumer's offsets are
committed together, or not at all.

    pip install '.[broker]'                                  # from a checkout
    pip install "$(echo dist/aioproducer-*.whl)[broker]"     # or a wheel (README)
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/transactions.py
(without AIOPRODUCER_BOOTSTRAP it starts an embedded broker for itself)
"""

import asyncio
import contextlib
import os

from aioproducer import Producer
from aioproducer.testing import EmbeddedBroker


async def main(bootstrap: str) -> None:
    async with Producer(bootstrap, transactional_id="enricher-1") as producer:
        # Records read from "raw" (by any consumer) up to offset 100 are transformed...
        consumed = [(offset, b"event-%d" % offset) for offset in range(100)]
        async with producer.transaction():  # commits at the end, aborts on an exception
            for _offset, value in consumed:
                await producer.enqueue("enriched", value.upper())
            # ...and the group's position moves in the same transaction.
            await producer.send_offsets_to_transaction({("raw", 0): 100}, "enricher")
        print(f"committed {len(consumed)} records and the offsets of group 'enricher'")

        try:
            async with producer.transaction():
                await producer.enqueue("enriched", b"half-done")
                raise ValueError("something went wrong")
        except ValueError:
            # Marked aborted on the broker. (The embedded dev broker, Tansu, still shows
            # aborted records to read_committed consumers; Kafka does not.)
            print("aborted: read_committed consumers of Kafka never see 'half-done'")


if __name__ == "__main__":
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
        if not bootstrap:
            broker = stack.enter_context(EmbeddedBroker())
            broker.create_topic("raw", 1)
            broker.create_topic("enriched", 1)
            bootstrap = broker.bootstrap
        asyncio.run(main(bootstrap))
