// A broker-side telemetry receiver for tests/real_kafka/test_telemetry.py, compiled there
// with javac against the Kafka jars and put on the broker's class path as a metric reporter
// (KIP-714 via KIP-1160's ClientTelemetryExporterProvider, Kafka 4.2+). It appends one line
// per PushTelemetry payload to the file named by the broker property aioproducer.telemetry.file:
// client id, client instance id, terminating (true/false), push interval (ms), and the OTLP
// MetricsData bytes (decompressed by the broker) in base64. A client whose id starts with
// "telemetry-poison" gets an exception after its line is written: the broker answers
// INVALID_RECORD.
package aioproducertest;

import java.io.FileWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

public class TelemetryDump implements MetricsReporter, ClientTelemetryExporterProvider {
    private volatile String path;

    @Override
    public void configure(Map<String, ?> configs) {
        Object file = configs.get("aioproducer.telemetry.file");
        path = file == null ? null : file.toString();
    }

    @Override
    public void init(List<KafkaMetric> metrics) {}

    @Override
    public void metricChange(KafkaMetric metric) {}

    @Override
    public void metricRemoval(KafkaMetric metric) {}

    @Override
    public void close() {}

    @Override
    public ClientTelemetryExporter clientTelemetryExporter() {
        return new ClientTelemetryExporter() {
            @Override
            public void exportMetrics(ClientTelemetryContext context, ClientTelemetryPayload payload) {
                String clientId = context.authorizableRequestContext().clientId();
                ByteBuffer data = payload.data().duplicate();
                byte[] bytes = new byte[data.remaining()];
                data.get(bytes);
                String line = clientId + "\t" + payload.clientInstanceId() + "\t"
                    + payload.isTerminating() + "\t" + context.pushIntervalMs() + "\t"
                    + Base64.getEncoder().encodeToString(bytes) + "\n";
                synchronized (TelemetryDump.class) {
                    try (FileWriter out = new FileWriter(path, true)) {
                        out.write(line);
                    } catch (IOException e) {
                        throw new UncheckedIOException(e);
                    }
                }
                if (clientId.startsWith("telemetry-poison")) {
                    throw new IllegalStateException("this test receiver refuses " + clientId);
                }
            }
        };
    }
}
