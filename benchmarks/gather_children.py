"""asyncio.gather's own CPU per child over our record futures, with no broker: N
RecordFutures on batches of 1,000 records, gathered, the batches completed, the gather
awaited (what gather and the Future protocol it calls on our futures cost, apart from
producing); `--asyncio-futures` does the same over plain asyncio futures.

    python benchmarks/gather_children.py [N] [--rounds R] [--asyncio-futures]
"""
import argparse, asyncio, time
import uvloop
from aioproducer._internal.batch import ProducerBatch, RecordFuture
from aioproducer._speedups import IMPLEMENTATION

p = argparse.ArgumentParser()
p.add_argument("records", type=int, nargs="?", default=200_000)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--asyncio-futures", action="store_true")
args = p.parse_args()


class _Writer:  # what complete() asks of a batch's writer
    def free(self) -> None:
        pass


async def ours() -> float:
    loop = asyncio.get_running_loop()
    batches, futures = [], []
    for i in range(args.records // 1000):
        batch = ProducerBatch((i,), "t", 0, _Writer(), loop.create_future(), 0.0, 0.0, 0)
        batches.append(batch)
        futures += [RecordFuture(batch, j, 0) for j in range(1000)]
    cpu = time.process_time()
    gathering = asyncio.gather(*futures)
    for batch in batches:
        batch.complete(0, -1)
    await gathering
    return time.process_time() - cpu


async def plain() -> float:
    futures = [asyncio.get_running_loop().create_future() for _ in range(args.records)]
    cpu = time.process_time()
    gathering = asyncio.gather(*futures)
    for future in futures:
        future.set_result(None)
    await gathering
    return time.process_time() - cpu


shape = plain if args.asyncio_futures else ours
results = sorted(uvloop.run(shape()) / args.records * 1e6 for _ in range(args.rounds))
print(f"{IMPLEMENTATION} gather over {'asyncio' if args.asyncio_futures else 'our'} futures: "
      f"us CPU per child median {results[len(results) // 2]:.2f} "
      f"({', '.join(f'{x:.2f}' for x in results)})")
