// The Java KafkaProducer in the shapes benchmarks/clients.py measures for the Python clients,
// with the same records and settings; benchmarks/java.py compiles it against kafka-clients.
//
//   java -cp LIB/*:CLASSES Bench SHAPE --bootstrap B --topic T --records N [--warmup W]
//        [--keyless] [--acks 1|all] [--rate R] [--threads N] [--jfr FILE]
//
// Shapes: async (send() with a callback per record, then flush()), latency (send().get() one
// at a time, each at its slot of --rate a second or when the previous one is acknowledged,
// linger 0: clients.py's latency shape), threads (--threads threads sharing one producer,
// each calling send().get() in a loop: clients.py's concurrent shape, 1,000 tasks awaiting
// send()). The first --warmup records are sent the same way and flushed before the clock
// starts: JIT warm-up and the first connections are reported apart from the steady state.
// Prints one JSON line, as clients.py does, with each thread's CPU over the steady state
// (benchmarks/yardstick_profile.py splits Java's CPU per record by thread with it); --jfr
// records the steady state alone with Java Flight Recorder into FILE.

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

import jdk.jfr.Configuration;
import jdk.jfr.Recording;

public final class Bench {
    private String shape, bootstrap, topic, acks = "1", jfr;
    private int records, warmup, threads = 1000;
    private boolean keyless;
    private double rate = 1000;
    private byte[] value;
    private byte[][] keys;
    private final AtomicLong failed = new AtomicLong();
    private final AtomicReference<Exception> firstError = new AtomicReference<>();

    public static void main(String[] argv) throws Exception {
        Bench b = new Bench();
        b.shape = argv[0];
        for (int i = 1; i < argv.length; i++) {
            switch (argv[i]) {
                case "--bootstrap" -> b.bootstrap = argv[++i];
                case "--topic" -> b.topic = argv[++i];
                case "--records" -> b.records = Integer.parseInt(argv[++i]);
                case "--warmup" -> b.warmup = Integer.parseInt(argv[++i]);
                case "--keyless" -> b.keyless = true;
                case "--acks" -> b.acks = argv[++i];
                case "--rate" -> b.rate = Double.parseDouble(argv[++i]);
                case "--threads" -> b.threads = Integer.parseInt(argv[++i]);
                case "--jfr" -> b.jfr = argv[++i];
                default -> throw new IllegalArgumentException("unknown argument " + argv[i]);
            }
        }
        b.run();
    }

    private void run() throws Exception {
        // The records clients.py makes: one random 100-byte value, keys key-%012d of i % 100,000.
        value = new byte[100];
        new Random(1).nextBytes(value);
        int total = warmup + records;
        keys = new byte[total][];
        for (int i = 0; i < total; i++) {
            keys[i] = keyless ? null
                : String.format("key-%012d", i % 100_000).getBytes(StandardCharsets.US_ASCII);
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("acks", acks);
        props.put("enable.idempotence", "false");
        props.put("linger.ms", shape.equals("latency") ? "0" : "5");
        props.put("batch.size", "16384");
        props.put("compression.type", "none");
        long jvmStartMs = ManagementFactory.getRuntimeMXBean().getStartTime();
        double startup = (System.currentTimeMillis() - jvmStartMs) / 1e3;  // JVM start to records made
        List<Double> latencies = new ArrayList<>();
        double warmupSeconds, seconds;
        long cpuBefore, t1, t2;
        Map<String, long[]> threadsBefore, threadsAfter;
        long[] processBefore, processAfter;
        Recording recording = null;
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            long t0 = System.nanoTime();
            phase(producer, 0, warmup, null);
            producer.flush();
            if (jfr != null) {
                // The profile settings, but every running thread sampled each millisecond.
                recording = new Recording(Configuration.getConfiguration("profile"));
                recording.enable("jdk.ExecutionSample").withPeriod(Duration.ofMillis(1));
                recording.start();
            }
            threadsBefore = threadTicks();
            processBefore = processTicks();
            t1 = System.nanoTime();
            cpuBefore = processCpuNanos();
            phase(producer, warmup, total, latencies);
            producer.flush();
            t2 = System.nanoTime();
            threadsAfter = threadTicks();
            processAfter = processTicks();
            if (recording != null) {
                recording.stop();
                recording.dump(Path.of(jfr));
                recording.close();
            }
            warmupSeconds = (t1 - t0) / 1e9;
            seconds = (t2 - t1) / 1e9;
        }
        long cpuAfter = processCpuNanos();
        if (failed.get() > 0) {
            throw new IllegalStateException(failed.get() + " sends failed, the first: "
                                            + firstError.get());
        }
        StringBuilder out = new StringBuilder();
        out.append("{\"seconds\": ").append(seconds)
           .append(", \"warmup_seconds\": ").append(warmupSeconds)
           .append(", \"startup_seconds\": ").append(startup)
           .append(", \"cpu\": ").append(cpuAfter / 1e9)
           .append(", \"cpu_run\": ").append((cpuAfter - cpuBefore) / 1e9)
           .append(", \"rss_mb\": ").append(peakRssMb())
           .append(", \"steady_ns\": [").append(t1).append(", ").append(t2).append("]")
           .append(", \"threads\": {");
        // Each thread's user and system CPU seconds over the steady state, summed by name;
        // "(exited)" is what threads that ended before its end used (the process's figure,
        // which keeps theirs, less the living threads').
        Map<String, double[]> byName = new HashMap<>();
        long[] living = {0, 0};
        for (Map.Entry<String, long[]> entry : threadsAfter.entrySet()) {
            long[] before = threadsBefore.getOrDefault(entry.getKey(), new long[] {0, 0, 0});
            long[] after = entry.getValue();
            double[] sum = byName.computeIfAbsent(threadName(entry.getKey()), k -> new double[2]);
            for (int k = 0; k < 2; k++) {
                sum[k] += (after[k] - before[k]) / TICKS;
                living[k] += after[k] - before[k];
            }
        }
        byName.put("(exited)", new double[] {
            (processAfter[0] - processBefore[0] - living[0]) / TICKS,
            (processAfter[1] - processBefore[1] - living[1]) / TICKS});
        String sep = "";
        for (Map.Entry<String, double[]> entry : byName.entrySet()) {
            out.append(sep).append('"').append(entry.getKey().replace("\"", "'")).append("\": [")
               .append(entry.getValue()[0]).append(", ").append(entry.getValue()[1]).append(']');
            sep = ", ";
        }
        out.append("}")
           .append(", \"latencies\": [");
        for (int i = 0; i < latencies.size(); i++) {
            out.append(i == 0 ? "" : ", ").append(latencies.get(i));
        }
        System.out.println(out.append("]}"));
    }

    private void phase(KafkaProducer<byte[], byte[]> producer, int from, int to,
                       List<Double> latencies) throws Exception {
        switch (shape) {
            case "async" -> {
                Callback callback = (metadata, error) -> {
                    if (error != null && failed.getAndIncrement() == 0) firstError.set(error);
                };
                for (int i = from; i < to; i++) {
                    producer.send(new ProducerRecord<>(topic, keys[i], value), callback);
                }
            }
            case "latency" -> {
                long start = System.nanoTime();
                for (int i = from; i < to; i++) {
                    long slot = start + (long) ((i - from) / rate * 1e9);
                    long wait = slot - System.nanoTime();
                    if (wait > 0) {  // whole milliseconds, as every Python harness sleeps
                        Thread.sleep((wait + 999_999) / 1_000_000);
                    }
                    long sent = System.nanoTime();
                    producer.send(new ProducerRecord<>(topic, keys[i], value)).get();
                    if (latencies != null) latencies.add((System.nanoTime() - sent) / 1e9);
                }
            }
            case "threads" -> {
                int share = (to - from) / threads;
                List<Thread> workers = new ArrayList<>();
                for (int t = 0; t < threads; t++) {
                    int lo = from + t * share, hi = t == threads - 1 ? to : lo + share;
                    Thread worker = new Thread(() -> {
                        try {
                            for (int i = lo; i < hi; i++) {
                                producer.send(new ProducerRecord<>(topic, keys[i], value)).get();
                            }
                        } catch (Exception e) {
                            if (failed.getAndIncrement() == 0) firstError.set(e);
                        }
                    }, "sender-" + t);
                    worker.setDaemon(true);
                    worker.start();
                    workers.add(worker);
                }
                for (Thread worker : workers) worker.join();
            }
            default -> throw new IllegalArgumentException("unknown shape " + shape);
        }
    }

    /** The whole process's CPU (every thread: the sender's, the JIT's, the collector's). */
    private static long processCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean)
                ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    private static final double TICKS = 100.0;  // USER_HZ, the unit of /proc's CPU times

    /** Each living thread's user and system CPU ticks, by "tid name" (from /proc). */
    private static Map<String, long[]> threadTicks() throws Exception {
        Map<String, long[]> ticks = new HashMap<>();
        try (var tasks = Files.list(Path.of("/proc/self/task"))) {
            for (Path task : (Iterable<Path>) tasks::iterator) {
                try {
                    String name = Files.readString(task.resolve("comm")).strip();
                    ticks.put(task.getFileName() + " " + name, statTicks(task.resolve("stat")));
                } catch (java.io.IOException gone) {  // the thread ended meanwhile
                }
            }
        }
        return ticks;
    }

    /** The whole process's user and system CPU ticks, exited threads' included. */
    private static long[] processTicks() throws Exception {
        return statTicks(Path.of("/proc/self/stat"));
    }

    private static long[] statTicks(Path stat) throws Exception {
        String line = Files.readString(stat);
        // Fields after the parenthesised name: state is the 3rd field, utime the 14th.
        String[] fields = line.substring(line.lastIndexOf(')') + 2).split(" ");
        return new long[] {Long.parseLong(fields[11]), Long.parseLong(fields[12])};
    }

    /** A thread's name without its number, so that threads of one kind add up. */
    private static String threadName(String tidAndName) {
        return tidAndName.substring(tidAndName.indexOf(' ') + 1).replaceAll("#?[0-9]+$", "#");
    }

    private static double peakRssMb() throws Exception {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("VmHWM:")) {
                return Long.parseLong(line.split("\\s+")[1]) / 1024.0;
            }
        }
        return -1;
    }
}
