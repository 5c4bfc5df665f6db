package cdc.platform.parse;

import java.util.AbstractMap;
import java.util.AbstractSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF4;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The envelope parser as a Spark function: {@code parse(value, kafka_key)} of binary columns gives the
 * struct {@link #SCHEMA}, one per line, which {@code cdc_platform/parse/parse_spark.py} turns into PARSED
 * columns (times and dates from their numbers, the line and the Kafka origin from the input). The key
 * spec is captured as its JSON text and read once per task.
 */
public final class SparkParse {
    private SparkParse() {}

    /** The struct each line parses to: PARSED's columns but the input's own, times as epoch microseconds, dates as days. */
    public static final StructType SCHEMA = new StructType(new StructField[] {
        field("kind", DataTypes.StringType),
        field("event_id", DataTypes.StringType),
        field("table_id", DataTypes.StringType),
        field("source_connector", DataTypes.StringType),
        field("source_name", DataTypes.StringType),
        field("source_db", DataTypes.StringType),
        field("source_schema", DataTypes.StringType),
        field("source_table", DataTypes.StringType),
        field("op", DataTypes.StringType),
        field("key", DataTypes.StringType),
        field("before", DataTypes.StringType),
        field("after", DataTypes.StringType),
        field("row_schema", DataTypes.StringType),
        field("position", DataTypes.StringType),
        field("position_kind", DataTypes.StringType),
        field("source_ts_us", DataTypes.LongType),
        field("envelope_ts_us", DataTypes.LongType),
        field("snapshot", DataTypes.BooleanType),
        field("transaction_id", DataTypes.StringType),
        field("transaction_raw_id", DataTypes.StringType),
        field("tx_total_order", DataTypes.LongType),
        field("tx_collection_order", DataTypes.LongType),
        field("event_day", DataTypes.IntegerType),
        field("marker_id", DataTypes.StringType),
        field("marker_day", DataTypes.IntegerType),
        field("status", DataTypes.StringType),
        field("event_count", DataTypes.LongType),
        field("data_collections", DataTypes.createMapType(DataTypes.StringType, DataTypes.LongType, true)),
        field("marker_shape", DataTypes.StringType),
        field("marker_ts_us", DataTypes.LongType),
        field("reason_code", DataTypes.StringType),
        field("reason", DataTypes.StringType),
        field("line", DataTypes.StringType),
    });

    private static StructField field(String name, DataType type) {
        return DataTypes.createStructField(name, type, true);
    }

    /** The parse of {@code value} (binary: the line's bytes) with {@code recordKey} (binary, or a null literal). */
    public static Column parse(Column value, Column recordKey, String keySpecJson) {
        Column none = functions.lit(null).cast(DataTypes.StringType);
        return parse(value, recordKey, none, none, keySpecJson);
    }

    /**
     * The parse of {@code value} with {@code recordKey}, unless the source rejected the record ({@code rejectCode},
     * a string column, not null; {@code rejectReason} its sentence): then a dead letter with that code and reason,
     * whose line is the input's value ({@code jvm_parse.parse_rows} takes it from there). Decided here, not by a
     * Spark {@code CASE} per output column: those were a third of the generated method that holds an Avro batch's
     * decode and parse, which HotSpot leaves interpreted past 8,000 bytes of bytecode.
     */
    public static Column parse(Column value, Column recordKey, Column rejectCode, Column rejectReason, String keySpecJson) {
        Envelope.keySpec(keySpecJson); // a bad spec fails here, in the driver, not in every task
        UserDefinedFunction udf = functions.udf(new Parse(keySpecJson), SCHEMA).withName("cdc_parse_envelope");
        return udf.apply(value, recordKey, rejectCode, rejectReason);
    }

    /** The function Spark ships to its executors; the parser is made once per deserialised copy (a task). */
    static final class Parse implements UDF4<byte[], byte[], String, String, Row> {
        private final String keySpecJson;
        private transient Envelope envelope;

        Parse(String keySpecJson) {
            this.keySpecJson = keySpecJson;
        }

        @Override
        public Row call(byte[] value, byte[] recordKey, String rejectCode, String rejectReason) {
            if (rejectCode != null) return row(rejected(rejectCode, rejectReason));
            if (envelope == null) envelope = new Envelope(Envelope.keySpec(keySpecJson));
            return row(envelope.parse(value, recordKey));
        }
    }

    /** The dead letter of a record the source could not make a line of (its line is the input's value, set by the caller). */
    static ParsedRow rejected(String code, String reason) {
        ParsedRow row = new ParsedRow("dead_letter");
        row.reasonCode = code;
        row.reason = reason != null ? reason : code;
        return row;
    }

    static Row row(ParsedRow r) {
        return RowFactory.create(
            r.kind, r.eventId, r.tableId, r.sourceConnector, r.sourceName, r.sourceDb, r.sourceSchema, r.sourceTable, r.op,
            r.key, r.before, r.after, r.rowSchema, r.position, r.positionKind, r.sourceTs, r.envelopeTs, r.snapshot,
            r.transactionId, r.transactionRawId, r.txTotalOrder, r.txCollectionOrder, r.eventDate, r.markerId, r.markerDate,
            r.status, r.eventCount, r.dataCollections == null ? null : new PairMap(r.dataCollections), r.markerShape, r.markerTs,
            r.reasonCode, r.reason, r.line);
    }

    /**
     * A marker's counts as the map Spark converts (it walks {@code entrySet()}), in order and with a name
     * that repeats kept twice: Arrow's map, which the Python parser fills from the same list, keeps both.
     */
    static final class PairMap extends AbstractMap<String, Long> {
        private final List<Map.Entry<String, Long>> pairs;

        PairMap(List<Map.Entry<String, Long>> pairs) {
            this.pairs = pairs;
        }

        @Override
        public Set<Map.Entry<String, Long>> entrySet() {
            return new AbstractSet<>() {
                @Override
                public Iterator<Map.Entry<String, Long>> iterator() {
                    return pairs.iterator();
                }

                @Override
                public int size() {
                    return pairs.size();
                }
            };
        }
    }

    /** The parse of one line as JSON text (for tests and tools: the same row without Spark). */
    public static String debug(byte[] value, byte[] recordKey, String keySpecJson) {
        ParsedRow r = new Envelope(Envelope.keySpec(keySpecJson)).parse(value, recordKey);
        Row row = row(r);
        StringBuilder out = new StringBuilder("{");
        for (int i = 0; i < SCHEMA.fields().length; i++) {
            if (i > 0) out.append(',');
            PyWriter.string(out, SCHEMA.fields()[i].name());
            out.append(':');
            Object v = row.get(i);
            if (v == null) out.append("null");
            else if (v instanceof String) PyWriter.string(out, (String) v);
            else if (v instanceof Map) {
                out.append('[');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) out.append(',');
                    first = false;
                    out.append('[');
                    PyWriter.string(out, (String) e.getKey());
                    out.append(',').append(e.getValue()).append(']');
                }
                out.append(']');
            } else out.append(v);
        }
        return out.append('}').toString();
    }
}
