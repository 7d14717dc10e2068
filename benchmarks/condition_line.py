"""The memory line's waiting path (issue 37): a future per waiter served synchronously (the
accumulator's line) against an asyncio.Condition per waiter (the Java BufferPool's deque of
Conditions), in one process, no broker.

    python benchmarks/condition_line.py [WAITERS]

N tasks wait in line; memory comes back one waiter's worth at a time from a plain callback
(as a batch's completion does); each waiter is served in order. CPU per waiting record,
median of 5. (The fast path, memory free and nobody waiting, makes neither a future nor a
Condition in either shape: nothing to measure.) See docs/architecture.md."""
import asyncio
import collections
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000

async def futures_line():
    loop = asyncio.get_running_loop()
    line = collections.deque()
    served = []
    async def waiter(i):
        turn = loop.create_future()
        line.append(turn)
        await turn
        served.append(i)
    def free_one():  # a batch finished: serve the head synchronously
        if line:
            line.popleft().set_result(None)
            loop.call_soon(free_one)
    tasks = [asyncio.create_task(waiter(i)) for i in range(N)]
    await asyncio.sleep(0)
    loop.call_soon(free_one)
    await asyncio.gather(*tasks)
    assert served == list(range(N))

async def condition_line():
    loop = asyncio.get_running_loop()
    line = collections.deque()
    served = []
    granted = set()
    async def waiter(i):
        cond = asyncio.Condition()
        line.append((i, cond))
        async with cond:
            await cond.wait_for(lambda: i in granted)
        served.append(i)
    async def notify(i, cond):  # notify() needs the lock: a coroutine, so a Task per wake
        async with cond:
            granted.add(i)
            cond.notify()
    def free_one():
        if line:
            i, cond = line.popleft()
            loop.create_task(notify(i, cond))
            loop.call_soon(free_one)
    tasks = [asyncio.create_task(waiter(i)) for i in range(N)]
    await asyncio.sleep(0)
    loop.call_soon(free_one)
    await asyncio.gather(*tasks)
    assert served == list(range(N))

for name, run in (("futures (ours)", futures_line), ("Condition per waiter", condition_line)):
    best = []
    for _ in range(5):
        start = time.process_time()
        asyncio.run(run())
        best.append(time.process_time() - start)
    best.sort()
    print(f"{name:24} waiting path: {best[2] / N * 1e6:.2f} us CPU per waiting record "
          f"(median of 5, {N} waiters)")
