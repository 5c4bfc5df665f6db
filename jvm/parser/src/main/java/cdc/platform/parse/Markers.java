package cdc.platform.parse;

import java.math.BigInteger;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static cdc.platform.parse.PyValues.asInt;
import static cdc.platform.parse.PyValues.asTsMs;
import static cdc.platform.parse.PyValues.pyStrip;
import static cdc.platform.parse.PyValues.truthy;

/**
 * Transaction markers, Debezium's ({@code status} BEGIN/END) and Stripe's ({@code marker} BEGIN/COMMIT): the
 * port of {@code envelope._parse_debezium_marker}, {@code _parse_stripe_marker} and {@code _marker_row}, with
 * {@code control_records.merge_collections}.
 */
final class Markers {
    private Markers() {}

    private static final String MESSAGE_COLLECTION = "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId";

    @SuppressWarnings("unchecked")
    static ParsedRow parseDebeziumMarker(Map<String, Object> env) throws Dead, PyWriter.TooDeep {
        Object status = env.get("status");
        if (!"BEGIN".equals(status) && !"END".equals(status)) {
            throw new Dead("invalid_marker", "status " + PyWriter.quote(status, 40) + " is not BEGIN or END");
        }
        Long count = asInt(env.get("event_count"), "event_count");
        List<Map.Entry<String, Long>> collections = null;
        Object raw = env.get("data_collections");
        if (raw != null) {
            if (!(raw instanceof List)) throw new Dead("invalid_marker", "data_collections is not a list");
            List<Map.Entry<String, Long>> counted = new ArrayList<>();
            for (Object item : (List<Object>) raw) {
                if (!(item instanceof Map) || !(((Map<String, Object>) item).get("data_collection") instanceof String)) {
                    throw new Dead("invalid_marker", "data_collections entry lacks `data_collection`");
                }
                Map<String, Object> it = (Map<String, Object>) item;
                Long n = asInt(it.get("event_count"), "data_collections[].event_count");
                counted.add(new AbstractMap.SimpleImmutableEntry<>((String) it.get("data_collection"), n == null ? 0L : n));
            }
            collections = mergeCollections(counted);
        }
        if ("END".equals(status) && count == null) throw new Dead("invalid_marker", "END has no event_count; completeness cannot be judged");
        Object id = env.get("id");
        Long ts = asTsMs(env.get("ts_ms"), "ts_ms");
        return markerRow(id, (String) status, count, collections, "debezium", ts);
    }

    /** {@code control_records.merge_collections}: messages' collection named {@link Envelope#MESSAGES}, counts of one name summed. */
    static List<Map.Entry<String, Long>> mergeCollections(List<Map.Entry<String, Long>> counted) throws Dead {
        Map<String, BigInteger> merged = new LinkedHashMap<>();
        for (Map.Entry<String, Long> e : counted) {
            String key = e.getKey().startsWith(MESSAGE_COLLECTION) ? Envelope.MESSAGES : e.getKey();
            merged.merge(key, BigInteger.valueOf(e.getValue()), BigInteger::add);
        }
        List<Map.Entry<String, Long>> out = new ArrayList<>();
        for (Map.Entry<String, BigInteger> e : merged.entrySet()) {
            if (e.getValue().bitLength() >= 64) {
                throw new Dead("out_of_range", "`data_collections[].event_count` of " + PyWriter.quote(e.getKey(), 60) + " sums to "
                        + e.getValue() + ", outside the signed 64-bit range");
            }
            out.add(new AbstractMap.SimpleImmutableEntry<>(e.getKey(), e.getValue().longValue()));
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    static ParsedRow parseStripeMarker(Map<String, Object> env) throws Dead, PyWriter.TooDeep {
        Object marker = env.get("marker");
        if (!"BEGIN".equals(marker) && !"COMMIT".equals(marker) && !"END".equals(marker)) {
            throw new Dead("invalid_marker", "marker " + PyWriter.quote(marker, 40) + " is not BEGIN or COMMIT");
        }
        String status = "BEGIN".equals(marker) ? "BEGIN" : "END";
        Long count = asInt(env.get("total_events"), "total_events");
        Object raw = env.get("per_source_event_counts");
        List<Map.Entry<String, Long>> collections = null;
        if (raw != null) {
            List<Object[]> items = new ArrayList<>();
            if (raw instanceof Map) {
                for (Map.Entry<String, Object> e : ((Map<String, Object>) raw).entrySet()) items.add(new Object[] {e.getKey(), e.getValue()});
            } else if (raw instanceof List) {
                for (Object i : (List<Object>) raw) {
                    if (!(i instanceof Map)) continue;
                    Map<String, Object> it = (Map<String, Object>) i;
                    Object source = it.get("source");
                    Object name = truthy(source) ? source : it.get("data_collection");
                    Object n = it.containsKey("event_count") ? it.get("event_count") : it.get("count");
                    items.add(new Object[] {name, n});
                }
            } else {
                throw new Dead("invalid_marker", "per_source_event_counts is not an object");
            }
            collections = new ArrayList<>();
            for (Object[] item : items) {
                if (!(item[0] instanceof String)) throw new Dead("invalid_marker", "per_source_event_counts has an entry without a source name");
                Long n = asInt(item[1], "per_source_event_counts");
                collections.add(new AbstractMap.SimpleImmutableEntry<>((String) item[0], n == null ? 0L : n));
            }
        }
        if (status.equals("END") && count == null) throw new Dead("invalid_marker", "COMMIT has no total_events; completeness cannot be judged");
        Object rawId = env.containsKey("transaction_id") ? env.get("transaction_id")
                : env.containsKey("id") ? env.get("id") : env.get("txn_id");
        Object tsValue = env.containsKey("ts_ms") ? env.get("ts_ms") : env.get("timestamp_ms");
        Long ts = asTsMs(tsValue, "ts_ms");
        return markerRow(rawId, status, count, collections, "stripe", ts);
    }

    private static ParsedRow markerRow(Object rawId, String status, Long count, List<Map.Entry<String, Long>> collections, String shape, Long tsMs)
            throws Dead, PyWriter.TooDeep {
        if (rawId == null || (rawId instanceof String && pyStrip((String) rawId).isEmpty())) {
            throw new Dead("invalid_marker", "has no transaction id (`id`); it cannot be matched to its events");
        }
        if (rawId instanceof Map || rawId instanceof List) throw new Dead("invalid_marker", "id is not a string or number");
        String rawText = PyWriter.str(rawId);
        String txId = Envelope.normaliseTransactionId(rawText);
        ParsedRow row = new ParsedRow("marker");
        row.markerId = txId + "|" + status;
        row.markerDate = tsMs == null ? null : (int) Math.floorDiv(tsMs, Envelope.MS_PER_DAY);
        row.transactionId = txId;
        row.transactionRawId = rawText;
        row.status = status;
        row.eventCount = count;
        row.dataCollections = collections;
        row.markerShape = shape;
        row.markerTs = tsMs == null ? null : tsMs * 1000;
        return row;
    }

}
