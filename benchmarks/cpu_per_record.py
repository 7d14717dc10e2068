"""aioproducer's CPU per record, in this process: enqueue + gather and enqueue_many (and, with
--shapes flushed, the same enqueue() loop then flush() without gathering the futures: the
difference to gather is asyncio.gather's own cost; send, `gather(*(send(...) ...))`;
yielding, enqueue + gather yielding to the loop every 100 records, as a service's tasks do:
at many partitions the sender then drains a batch of one record per partition, so it
measures the cost of a batch; tasks, 1,000 tasks each awaiting `send()` in a loop; sync,
`BlockingProducer.produce()` per record from one thread, then `flush()`, both threads' CPU;
syncbulk, the same with `BlockingProducer.produce_many()` in 10,000-record calls),
on an embedded broker (the least load-sensitive
figure on a shared machine: the process's CPU seconds over the produce phase, not wall
time). --profile SHAPE prints a cProfile of that shape's first round (thread CPU time)
instead of timing it. --gc adds, per shape (the median round's), the collector's CPU per
record, its full collections and its young (generation-0) collections per 1,000 records (a
gc.callbacks timer), and minor page faults per batch.

    python benchmarks/cpu_per_record.py PARTITIONS [RECORDS] [--size B] [--rounds N]
        [--shapes gather,flushed,bulk,send,yielding,tasks,sync,syncbulk] [--profile SHAPE]
        [--asyncio]
        [--batch-size B] [--gc] [--acks all] [--timeouts-ms MS]

--acks all: an idempotent producer (the default setting, which acks=1 turns off).
--timeouts-ms: delivery_timeout_ms (and half of it request_timeout_ms): a 10,000-partition
idempotent run on a loaded machine expired records with the defaults.

(sync's and syncbulk's profiles are two: the producing thread's, then the producer's loop
thread's.)
"""
import argparse, asyncio, cProfile, gc, os, pstats, resource, sys, time
from aioproducer import Producer
from aioproducer.testing import EmbeddedBroker
from aioproducer._speedups import IMPLEMENTATION

p = argparse.ArgumentParser()
p.add_argument("partitions", type=int)
p.add_argument("records", type=int, nargs="?", default=200_000)
p.add_argument("--size", type=int, default=100)
p.add_argument("--profile", default=None)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--shapes", default="gather,bulk")
p.add_argument("--asyncio", action="store_true", help="not uvloop")
p.add_argument("--batch-size", type=int, default=0)
p.add_argument("--acks", default="1", choices=("1", "all"),
               help="all: idempotent, as by default (acks=1 turns idempotence off)")
p.add_argument("--gc", action="store_true", help="the collector's CPU and page faults too")
p.add_argument("--timeouts-ms", type=int, default=None)
args = p.parse_args()
TIMEOUTS = {} if args.timeouts_ms is None else {
    "delivery_timeout_ms": args.timeouts_ms, "request_timeout_ms": args.timeouts_ms // 2}
ACKS = 1 if args.acks == "1" else "all"
value = os.urandom(args.size)
data = [(b"key-%012d" % (i % 100_000), value) for i in range(args.records)]
collector = {"s": 0.0, "full": 0, "young": 0, "at": 0.0}  # CPU seconds, full and young ones


def _timed_collection(phase, info):
    if phase == "start":
        collector["at"] = time.thread_time()
    else:
        collector["s"] += time.thread_time() - collector["at"]
        collector["full"] += info["generation"] == 2
        collector["young"] += info["generation"] == 0


if args.gc:
    gc.callbacks.append(_timed_collection)


def snapshot():
    return (collector["s"], collector["full"], collector["young"],
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def since(before):
    """The collector's seconds, full and young collections, and minor faults, since `before`."""
    return tuple(now - then for now, then in zip(snapshot(), before))



async def gather(producer, topic):
    futs = [await producer.enqueue(topic, v, k) for k, v in data]
    await asyncio.gather(*futs)


async def flushed(producer, topic):
    """enqueue + gather without the gather: the difference is asyncio.gather's own cost."""
    futs = [await producer.enqueue(topic, v, k) for k, v in data]
    await producer.flush()
    assert futs[-1].done()


async def bulk(producer, topic):
    results = [await producer.enqueue_many(topic, data[i:i + 10_000])
               for i in range(0, len(data), 10_000)]
    await producer.flush()
    for r in results:
        await r

async def send(producer, topic):
    await asyncio.gather(*(producer.send(topic, v, k) for k, v in data))


async def yielding(producer, topic):
    futs = []
    for i, (k, v) in enumerate(data):
        futs.append(await producer.enqueue(topic, v, k))
        if i % 100 == 99:
            await asyncio.sleep(0)
    await asyncio.gather(*futs)


async def tasks(producer, topic):
    share = len(data) // 1000

    async def worker(part):
        for key, value in part:
            await producer.send(topic, value, key)
    await asyncio.gather(*(worker(data[i * share:(i + 1) * share]) for i in range(1000)))

SHAPES = {"gather": gather, "flushed": flushed, "bulk": bulk, "send": send, "yielding": yielding, "tasks": tasks}


def sync(bootstrap, topic, profile, bulk):
    """BlockingProducer.produce() per record (or, `bulk`, produce_many() per 10,000), then
    flush(): both threads' CPU."""
    from aioproducer import BlockingProducer
    extra = {"batch_size": args.batch_size} if args.batch_size else {}
    extra.update(TIMEOUTS)
    with BlockingProducer(bootstrap, acks=ACKS, linger_ms=5, **extra) as producer:
        producer.partitions_for(topic)
        gc.collect()  # (see one())
        cpu, mark = time.process_time(), snapshot()
        if profile:
            profs = [cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)]
            profs[0].enable()
            producer._portal.call(profs[1].enable)
        if bulk:
            results = [producer.produce_many(topic, data[i:i + 10_000])
                       for i in range(0, len(data), 10_000)]
        else:
            produce = producer.produce
            for key, value in data:
                produce(topic, value, key)
        producer.flush()
        if bulk:
            for result in results:
                result.result()
        if profile:
            profs[0].disable()
            producer._portal.call(profs[1].disable)
        used = time.process_time() - cpu
        costs.append(since(mark))
        batches.append(producer.metrics().batches_sent)
    return used / len(data) * 1e6, (profs if profile else None)


async def one(bootstrap, topic, shape, profile):
    extra = {"batch_size": args.batch_size} if args.batch_size else {}
    extra.update(TIMEOUTS)
    async with Producer(bootstrap, acks=ACKS, linger_ms=5, **extra) as producer:
        await producer.partitions_for(topic)
        # The garbage of the rounds before (their producers, loops, broker connections) is
        # not this round's: collected here, not by a full collection inside the timed phase.
        gc.collect()
        cpu, mark = time.process_time(), snapshot()
        if profile:
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
        await SHAPES[shape](producer, topic)
        if profile:
            prof.disable()
        used = time.process_time() - cpu
        costs.append(since(mark))
        batches.append(producer.metrics().batches_sent)
    return used / args.records * 1e6, (prof if profile else None)


batches = []  # acknowledged per round
costs = []  # per round: the collector's seconds, its full and young collections, minor faults
with EmbeddedBroker() as broker:
    n = 0
    for shape in args.shapes.split(","):
        results = []
        for r in range(args.rounds):
            n += 1
            topic = f"m{n}"
            broker.create_topic(topic, args.partitions)
            runner = asyncio.run if args.asyncio else __import__("uvloop").run
            profiled = args.profile == shape and r == 0
            if shape in ("sync", "syncbulk"):
                us, prof = sync(broker.bootstrap, topic, profiled, shape == "syncbulk")
            else:
                us, prof = runner(one(broker.bootstrap, topic, shape, profiled))
            if prof:
                for p in prof if isinstance(prof, list) else [prof]:
                    st = pstats.Stats(p); st.sort_stats("tottime").print_stats(35)
            else:
                results.append((us, costs[-1], batches[-1]))
        if results:
            results.sort()
            median = results[len(results) // 2]
            extra = ""
            if args.gc:
                seconds, full, young, faults = median[1]
                extra = (f"; collector {seconds / args.records * 1e6:.2f} us/record ({full} full, "
                         f"{young / args.records * 1000:.2f} young per 1,000 records), "
                         f"{faults / max(median[2], 1):.2f} minor faults/batch")
            results = [us for us, _, _ in results]
            idempotent = " acks=all" if ACKS == "all" else ""
            print(f"{IMPLEMENTATION} p{args.partitions} s{args.size}{idempotent} {shape}: "
                  f"us CPU/record median {results[len(results)//2]:.2f} min {results[0]:.2f} "
                  f"({', '.join(f'{x:.2f}' for x in results)}) {batches[-1]} batches load "
                  f"{os.getloadavg()[0]:.1f}{extra}",
                  flush=True)
