package cdc.platform.parse;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static cdc.platform.parse.PyValues.asInt;
import static cdc.platform.parse.PyValues.asTsMs;
import static cdc.platform.parse.PyValues.jsonType;
import static cdc.platform.parse.PyValues.truthy;

/**
 * The envelope parser: one Debezium line (its bytes) to one PARSED row, a port of
 * {@code cdc_platform/parse/envelope.py} ({@code parse_bytes} and {@code parse_line}, with
 * {@code control_records.py}) that gives the same row, field for field and byte for byte: the same kind,
 * event identity (BLAKE2b-128 of the same canonical JSON), table ids, positions, row-image texts, reason
 * codes and reason texts. The Python module is the reference of the rules; each method here names the
 * Python function it follows, and the tests hold the two to the same rows (tests/cdc_platform/test_jvm_parse.py).
 *
 * <p>One instance per Spark task (it memoises table ids and binlog indexes like the Python module); not
 * thread-safe.
 */
public final class Envelope {
    static final long MS_PER_DAY = 86_400_000L;
    static final int MAX_LINE_CHARS = 64 * 1024 * 1024;
    static final long MIN_TS_MS = -62_135_596_800_000L, MAX_TS_MS = 253_402_300_799_999L;
    static final String MESSAGES = "__debezium_messages";
    static final String HEARTBEAT = "heartbeat", SCHEMA_CHANGE = "schema_change";
    private static final String HEARTBEAT_SCHEMA = "io.debezium.connector.common.Heartbeat";
    private static final Set<String> KNOWN_OPS = Set.of("c", "u", "d", "r", "t");
    private static final List<String> PROCESSING_TIMES = List.of("ts_ms", "ts_us", "ts_ns");

    // Python's `re` with `$` (end, or before a final newline) and str classes (`\d`: any Unicode decimal digit).
    private static final Pattern SAFE_NAME = Pattern.compile("^[A-Za-z0-9_][A-Za-z0-9_$\\-]{0,127}$", Pattern.UNIX_LINES);
    private static final Pattern PG_TX_ID = Pattern.compile("^(\\p{Nd}+):(\\p{Nd}+)$", Pattern.UNIX_LINES);
    private static final Pattern TRAILING_DIGITS = Pattern.compile("(\\p{Nd}+)$", Pattern.UNIX_LINES);

    private static final Map<String, String> REASONS = Map.ofEntries(
        Map.entry("not_json", "line is not valid JSON ({detail}); fix the producer, the line is kept here verbatim"),
        Map.entry("not_object", "line is JSON {detail}, not an object; expected a Debezium change event, a transaction marker, or null"),
        Map.entry("missing_op", "change event has no `op`; expected one of c, u, d, r, t"),
        Map.entry("unknown_op", "change event has unknown op {detail}; expected one of c, u, d, r, t (Debezium `m` messages are not table changes)"),
        Map.entry("missing_table", "change event has no `source.table`; the connector must include source metadata (do not use ExtractNewRecordState / unwrap SMTs before this platform)"),
        Map.entry("unsafe_table_name", "table name {detail} is not a safe identifier (letters, digits, _, $, -); rename it with a RegexRouter SMT or fix the producer"),
        Map.entry("missing_after", "op {detail} without an `after` row image; inserts, updates and snapshot reads must carry the new row"),
        Map.entry("delete_without_row", "delete names no row (no `before` and no message key); set REPLICA IDENTITY FULL on the source table or carry the message key"),
        Map.entry("missing_key", "row image lacks key column(s) {detail} configured for this table; check `key:` in the config or the connector's column filters"),
        Map.entry("invalid_field", "field {detail}; Debezium emits these as the documented types"),
        Map.entry("invalid_marker", "transaction marker {detail}"),
        Map.entry("unrecognised_shape", "JSON object is neither a change event nor a transaction marker (keys: {detail})"),
        Map.entry("line_too_long", "line is {detail} bytes, over the parser's 64 MiB maximum; split the record or fix the producer"),
        Map.entry("not_utf8", "line is not valid UTF-8 ({detail}); the producer must write UTF-8 (the line is kept with the bad bytes as \\x escapes)"),
        Map.entry("lone_surrogate", "line holds a lone UTF-16 surrogate escape ({detail}), which no UTF-8 text can carry; fix the producer's JSON encoder"),
        Map.entry("out_of_range", "{detail}; the platform stores integers as signed 64-bit, floats as 64-bit and times between years 1 and 9999"),
        Map.entry("too_deep", "JSON nests deeper than the parser follows ({detail}); flatten the record or fix the producer")
    );

    static String reasonText(String code, String detail) {
        return REASONS.get(code).replace("{detail}", detail);
    }

    private final Map<String, List<String>> keys;
    private static final int MEMO_LIMIT = 4096;
    private final Map<String, BigInteger> binlogIndex = new HashMap<>();
    private final Memo memo = new Memo();

    /** {@code keys}: a table id's configured key columns (the config's {@code KeySpec}). */
    public Envelope(Map<String, List<String>> keys) {
        this.keys = keys;
    }

    /** {@code KeySpec} from its JSON form, {@code {"<table id>": ["col", ...], ...}}. */
    @SuppressWarnings("unchecked")
    public static Map<String, List<String>> keySpec(String json) {
        byte[] b = json.getBytes(StandardCharsets.UTF_8);
        Object doc;
        try {
            doc = PyJson.read(b, 0, b.length, null).value;
        } catch (Dead d) {
            throw new IllegalArgumentException("the key spec is not JSON: " + d.detail);
        }
        if (!(doc instanceof Map)) throw new IllegalArgumentException("the key spec must be a JSON object of table id to key columns");
        Map<String, List<String>> out = new HashMap<>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) doc).entrySet()) {
            List<String> cols = new ArrayList<>();
            for (Object c : (List<Object>) e.getValue()) cols.add((String) c);
            out.put(e.getKey(), cols);
        }
        return out;
    }

    // -- parse_bytes / parse_line --------------------------------------------------------------------------

    /** {@code parse_bytes(value, ...)} (a null value: {@code parse_line(None, ...)}); {@code recordKey}: the Kafka key's bytes. */
    public ParsedRow parse(byte[] value, byte[] recordKey) {
        if (value == null) {
            ParsedRow row = new ParsedRow("tombstone");
            row.line = "";
            return row;
        }
        int bad = Utf8.firstInvalid(value);
        if (bad >= 0) {
            ParsedRow row = dead(new Dead("not_utf8", String.format("byte 0x%02x at offset %d", value[bad] & 0xff, bad)));
            row.line = Utf8.backslashReplace(value);
            return row;
        }
        if (blankOrNull(value)) return new ParsedRow("tombstone");
        if (value.length > MAX_LINE_CHARS && Utf8.codePoints(value, 0, value.length) > MAX_LINE_CHARS) {
            return dead(new Dead("line_too_long", Integer.toString(value.length)));
        }
        int start = value.length >= 3 && (value[0] & 0xff) == 0xef && (value[1] & 0xff) == 0xbb && (value[2] & 0xff) == 0xbf ? 3 : 0;
        PyJson.Document doc;
        try {
            doc = PyJson.read(value, start, value.length, memo);
        } catch (Dead d) {
            return dead(d);
        }
        try {
            return parseObject(doc.value, recordKey == null ? null : new RecordKey(recordKey));
        } catch (Dead d) {
            return dead(d);
        } catch (PyWriter.TooDeep d) {
            return dead(new Dead("too_deep", "while writing the row image"));
        }
    }

    private static ParsedRow dead(Dead d) {
        ParsedRow row = new ParsedRow("dead_letter");
        row.reasonCode = d.code;
        row.reason = reasonText(d.code, d.detail);
        row.tableId = d.tableId;
        return row;
    }

    /** {@code not line.strip() or line.strip() == "null"}, with Python's whitespace. */
    static boolean blankOrNull(byte[] b) {
        int i = 0, j = b.length;
        while (i < j) {
            int n = pySpaceAt(b, i, j);
            if (n == 0) break;
            i += n;
        }
        while (j > i) {
            int k = j - 1;
            while (k > i && (b[k] & 0xc0) == 0x80) k--;
            if (pySpaceAt(b, k, j) != j - k) break;
            j = k;
        }
        return i == j || (j - i == 4 && b[i] == 'n' && b[i + 1] == 'u' && b[i + 2] == 'l' && b[i + 3] == 'l');
    }

    /** The byte length of the Python whitespace character at {@code i}, or 0. */
    private static int pySpaceAt(byte[] b, int i, int end) {
        int c = b[i] & 0xff;
        if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) ? 1 : 0;
        int n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        if (i + n > end) return 0;
        int cp = Utf8.decode(b, i, i + n).codePointAt(0);
        boolean space = cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029
                || cp == 0x202f || cp == 0x205f || cp == 0x3000;
        return space ? n : 0;
    }

    /** A Kafka record's key, read only when an event needs it ({@code envelope.RecordKey}). */
    static final class RecordKey {
        private final byte[] raw;

        RecordKey(byte[] raw) {
            this.raw = raw;
        }

        Object value() {
            byte[] b = Utf8.firstInvalid(raw) < 0 ? raw : Utf8.replace(raw).getBytes(StandardCharsets.UTF_8);
            try {
                return unwrap(PyJson.read(b, 0, b.length, null).value)[0];
            } catch (Dead d) {
                return null;
            }
        }
    }

    // -- _parse_object -------------------------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    private static Object[] unwrap(Object obj) {
        if (obj instanceof Map) {
            Map<String, Object> m = (Map<String, Object>) obj;
            if (m.size() == 2 && m.containsKey("payload") && m.containsKey("schema")) return new Object[] {m.get("payload"), m.get("schema")};
        }
        return new Object[] {obj, null};
    }

    @SuppressWarnings("unchecked")
    private ParsedRow parseObject(Object obj, RecordKey recordKey) throws Dead, PyWriter.TooDeep {
        if (obj == null) return new ParsedRow("tombstone");
        if (!(obj instanceof Map)) throw new Dead("not_object", jsonType(obj));
        Map<String, Object> m = (Map<String, Object>) obj;
        Object messageKey = recordKey;
        if (m.containsKey("value") && m.containsKey("key") && !m.containsKey("op") && !m.containsKey("payload")) {
            messageKey = unwrap(m.get("key"))[0];
            obj = m.get("value");
            if (obj == null) return new ParsedRow("tombstone");
        }
        Object[] ps = unwrap(obj);
        Object payload = ps[0], schema = ps[1];
        if (payload == null) return new ParsedRow("tombstone");
        if (!(payload instanceof Map)) throw new Dead("not_object", "payload " + jsonType(payload));
        Map<String, Object> p = (Map<String, Object>) payload;
        String control = controlKind(p, schema);
        if (control != null) {
            ParsedRow row = new ParsedRow("control");
            row.reasonCode = control;
            if (control.equals(HEARTBEAT)) {
                Object ms = p.get("ts_ms");
                if (ms instanceof Long && (Long) ms >= MIN_TS_MS && (Long) ms <= MAX_TS_MS) row.sourceTs = (Long) ms * 1000;
            }
            return row;
        }
        if (p.containsKey("op") || p.containsKey("source") || p.containsKey("after") || p.containsKey("before")) {
            return parseChange(p, schema, messageKey);
        }
        if (p.containsKey("status") && p.containsKey("id")) return Markers.parseDebeziumMarker(p);
        if (p.containsKey("marker")) return Markers.parseStripeMarker(p);
        TreeSet<String> names = new TreeSet<>(PyWriter.CODE_POINT_ORDER);
        names.addAll(p.keySet());
        List<String> first = new ArrayList<>(names).subList(0, Math.min(12, names.size()));
        throw new Dead("unrecognised_shape", first.isEmpty() ? "none" : String.join(", ", first));
    }

    /** {@code control_records.control_kind}. */
    @SuppressWarnings("unchecked")
    private static String controlKind(Map<String, Object> payload, Object schema) {
        if (schema instanceof Map && HEARTBEAT_SCHEMA.equals(((Map<String, Object>) schema).get("name"))) return HEARTBEAT;
        if (payload.size() == 1 && payload.containsKey("ts_ms")) return HEARTBEAT;
        if (!payload.containsKey("op") && (payload.containsKey("ddl") || payload.containsKey("tableChanges"))) return SCHEMA_CHANGE;
        return null;
    }

    // -- _parse_change -------------------------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    private ParsedRow parseChange(Map<String, Object> env, Object schema, Object messageKey) throws Dead, PyWriter.TooDeep {
        Object srcValue = env.get("source");
        if (srcValue == null) throw new Dead("missing_table");
        if (!(srcValue instanceof Map)) throw new Dead("invalid_field", "`source` is a " + jsonType(srcValue) + ", expected an object");
        Map<String, Object> src = (Map<String, Object>) srcValue;
        boolean message = "m".equals(env.get("op")) && env.get("message") instanceof Map;
        String tableId = message ? MESSAGES : tableId(src);
        String table = message ? null : (String) src.get("table");

        Object opValue = env.get("op");
        if (opValue == null) throw new Dead("missing_op", "", tableId);
        if (!message && (!(opValue instanceof String) || !KNOWN_OPS.contains(opValue))) {
            throw new Dead("unknown_op", PyWriter.quote(opValue, 40), tableId);
        }
        String op = (String) opValue;
        Object before = env.get("before"), after = env.get("after");
        if (before != null && !(before instanceof Map)) throw new Dead("invalid_field", "`before` is a " + jsonType(before) + ", expected an object or null", tableId);
        if (after != null && !(after instanceof Map)) throw new Dead("invalid_field", "`after` is a " + jsonType(after) + ", expected an object or null", tableId);
        if ((op.equals("c") || op.equals("u") || op.equals("r")) && after == null) throw new Dead("missing_after", "'" + op + "'", tableId);

        List<String> keyCols = keys.get(tableId);
        String keyText = null;
        Object beforeForKey;
        if (op.equals("d") && before == null) {
            if (messageKey instanceof RecordKey) messageKey = ((RecordKey) messageKey).value();
            if (messageKey instanceof Map && !((Map<String, Object>) messageKey).isEmpty()) beforeForKey = messageKey;
            else throw new Dead("delete_without_row", "", tableId);
        } else {
            beforeForKey = before;
        }
        if (keyCols != null && !keyCols.isEmpty() && !op.equals("t")) {
            Map<String, Object> image = (Map<String, Object>) (!op.equals("d") ? after : beforeForKey);
            Map<String, Object> keyValues = new LinkedHashMap<>();
            for (String c : keyCols) {
                Object v = image == null ? null : image.get(c);
                if (v == null) {
                    List<String> missing = new ArrayList<>();
                    for (String k : keyCols) if (image == null || image.get(k) == null) missing.add(k);
                    throw new Dead("missing_key", String.join(", ", missing), tableId);
                }
                keyValues.put(c, v);
            }
            keyText = PyWriter.json(keyValues, true, Limits.TEXT_DEPTH, memo);
        }

        Long sourceMs = asTsMs(src.get("ts_ms"), "source.ts_ms");
        Long envelopeMs = asTsMs(env.get("ts_ms"), "ts_ms");
        Object tx = env.get("transaction");
        String txRawId = null;
        Long txTotal = null, txColl = null;
        if (tx != null) {
            if (!(tx instanceof Map)) throw new Dead("invalid_field", "`transaction` is a " + jsonType(tx) + ", expected an object or null", tableId);
            Map<String, Object> t = (Map<String, Object>) tx;
            Object rawId = t.get("id");
            txRawId = rawId == null ? null : PyWriter.str(rawId);
            txTotal = asInt(t.get("total_order"), "transaction.total_order");
            txColl = asInt(t.get("data_collection_order"), "transaction.data_collection_order");
        }
        Object connectorValue = src.get("connector");
        String connector = truthy(connectorValue) ? PyWriter.str(connectorValue) : "";
        String[] position = position(connector, src, sourceMs, txTotal);
        Object snapshotFlag = src.get("snapshot");
        if (snapshotFlag instanceof Map || snapshotFlag instanceof List) {
            String kind = snapshotFlag instanceof Map ? "an object" : "an array";
            throw new Dead("invalid_field", "`source.snapshot` is " + kind + ", expected a string or boolean", tableId);
        }
        boolean snapshot = !snapshotFalse(snapshotFlag) || op.equals("r");

        String identity = PyWriter.canonicalWithout(env, PROCESSING_TIMES, Limits.IDENTITY_DEPTH, memo);
        String eventId = Blake2b.hex128(identity.getBytes(StandardCharsets.UTF_8));
        Object beforeImage = before != null ? before : (op.equals("d") ? beforeForKey : null);
        Long dayMs = sourceMs != null ? sourceMs : envelopeMs;
        Object name = src.get("name"), db = src.get("db"), namespace = src.get("schema");

        ParsedRow row = new ParsedRow("change");
        row.eventId = eventId;
        row.eventDate = dayMs == null ? null : (int) Math.floorDiv(dayMs, MS_PER_DAY);
        row.tableId = tableId;
        row.sourceConnector = connector.isEmpty() ? null : connector;
        row.sourceName = name == null ? null : PyWriter.str(name);
        row.sourceDb = db == null ? null : PyWriter.str(db);
        row.sourceSchema = namespace == null ? null : PyWriter.str(namespace);
        row.sourceTable = table;
        row.op = op;
        row.key = keyText;
        row.before = beforeImage == null ? null : PyWriter.json(beforeImage, false, Limits.TEXT_DEPTH, memo);
        row.after = after == null ? null : PyWriter.json(after, false, Limits.TEXT_DEPTH, memo);
        row.rowSchema = schema == null ? null : rowSchema(schema);
        row.position = position[0];
        row.positionKind = position[1];
        row.sourceTs = sourceMs == null ? null : sourceMs * 1000;
        row.envelopeTs = envelopeMs == null ? null : envelopeMs * 1000;
        row.snapshot = snapshot;
        row.transactionId = normaliseTransactionId(txRawId);
        row.transactionRawId = txRawId;
        row.txTotalOrder = txTotal;
        row.txCollectionOrder = txColl;
        return row;
    }

    /** Whether {@code flag in {None, False, "false", "False", ""}} (0 and 0.0 equal False in a Python set). */
    private static boolean snapshotFalse(Object flag) {
        if (flag == null || Boolean.FALSE.equals(flag)) return true;
        if (flag instanceof Long) return (Long) flag == 0;
        if (flag instanceof Double) return (Double) flag == 0.0;
        if (flag instanceof String) return flag.equals("false") || flag.equals("False") || flag.equals("");
        return false;
    }

    /** {@code _table_id}. */
    private static String tableId(Map<String, Object> src) throws Dead {
        Object table = src.get("table");
        Object schema = src.get("schema");
        Object namespace = truthy(schema) ? schema : src.get("db");
        if (table == null || "".equals(table)) throw new Dead("missing_table");
        if (!(table instanceof String)) throw new Dead("invalid_field", "`source.table` is a " + jsonType(table) + ", expected a string");
        for (Object part : new Object[] {table, namespace}) {
            if (part != null && (!(part instanceof String) || !SAFE_NAME.matcher((String) part).lookingAt())) {
                throw new Dead("unsafe_table_name", PyWriter.quote(part, 80));
            }
        }
        return namespace != null ? namespace + "." + table : (String) table;
    }

    /** {@code _position}: the source's log order as a fixed-width text, and which rule gave it. */
    private String[] position(String connector, Map<String, Object> src, Long sourceMs, Long txOrder) throws Dead, PyWriter.TooDeep {
        if (connector.equals("postgresql")) {
            BigInteger pg = pgPosition(src);
            if (pg != null) return new String[] {pad(pg, 20), "pg_lsn"};
        }
        if ((connector.equals("mysql") || connector.equals("mariadb")) && src.get("pos") != null) {
            Object file = src.get("file");
            BigInteger fileIndex = binlogIndex(truthy(file) ? PyWriter.str(file) : "");
            Long pos = asInt(src.get("pos"), "source.pos");
            Long row = asInt(src.get("row"), "source.row");
            return new String[] {pad(fileIndex, 10) + pad(pos, 20) + pad(row == null ? 0L : row, 10), "mysql_binlog"};
        }
        if (connector.equals("sqlserver") && src.get("commit_lsn") != null) {
            Long serial = asInt(src.get("event_serial_no"), "source.event_serial_no");
            Object change = src.get("change_lsn");
            return new String[] {PyWriter.str(src.get("commit_lsn")) + "|" + (truthy(change) ? PyWriter.str(change) : "") + "|"
                    + pad(serial == null ? 0L : serial, 10), "sqlserver_lsn"};
        }
        if (connector.equals("oracle") && src.get("scn") != null) {
            return new String[] {pad(asInt(src.get("scn"), "source.scn"), 30), "oracle_scn"};
        }
        if (connector.equals("mongodb") && src.get("ord") != null) {
            String time = pad(sourceMs == null ? 0L : sourceMs, 20);
            return new String[] {time + pad(asInt(src.get("ord"), "source.ord"), 10), "mongodb_oplog"};
        }
        return new String[] {pad(sourceMs == null ? 0L : sourceMs, 20) + pad(txOrder == null ? 0L : txOrder, 10), "source_ts_fallback"};
    }

    private static final BigInteger INT64_MAX = BigInteger.valueOf(Long.MAX_VALUE);

    /**
     * {@code _pg_position}: the higher of the event's {@code lsn} and the LSNs of Debezium's {@code source.sequence}
     * (the text {@code ["<last commit LSN>","<LSN>"]}, each a decimal string or null); null when it carries neither.
     * An incremental snapshot's re-read row has no {@code lsn}, only the sequence (envelope.py says why this is the
     * stream's order).
     */
    private static BigInteger pgPosition(Map<String, Object> src) throws Dead {
        Long lsn = asInt(src.get("lsn"), "source.lsn");
        Object sequence = src.get("sequence");
        if (sequence == null) return lsn == null ? null : BigInteger.valueOf(lsn);
        String[] groups = sequence instanceof String ? sequenceGroups(PyValues.pyStrip((String) sequence)) : null;
        if (groups == null) {
            if (lsn != null) return BigInteger.valueOf(lsn); // an unreadable sequence beside an LSN: the LSN alone
            throw new Dead("invalid_field", "`source.sequence` is " + PyWriter.quote(sequence, 60) + ", expected Debezium's "
                    + "'[\"<last commit LSN>\",\"<LSN>\"]' (an event without `source.lsn` is placed by it)");
        }
        BigInteger highest = lsn == null ? null : BigInteger.valueOf(lsn);
        for (String g : groups) {
            if (g != null) {
                BigInteger v = new BigInteger(g);
                if (highest == null || v.compareTo(highest) > 0) highest = v;
            }
        }
        if (highest != null && highest.compareTo(INT64_MAX) > 0) {
            throw new Dead("out_of_range", "`source.sequence` holds " + highest + ", outside the signed 64-bit range");
        }
        return highest;
    }

    /** The two groups of {@code _PG_SEQUENCE_RE.fullmatch(text)} (null for a {@code null}), or null when it does not match. */
    private static String[] sequenceGroups(String text) {
        int[] at = {0};
        String[] out = new String[2];
        if (!expect(text, at, '[')) return null;
        for (int k = 0; k < 2; k++) {
            skipSpace(text, at);
            if (text.startsWith("null", at[0])) {
                at[0] += 4;
            } else {
                if (!expect(text, at, '"')) return null;
                int start = at[0];
                while (at[0] < text.length() && text.charAt(at[0]) >= '0' && text.charAt(at[0]) <= '9') at[0]++;
                int n = at[0] - start;
                if (n < 1 || n > 20 || !expect(text, at, '"')) return null;
                out[k] = text.substring(start, start + n);
            }
            skipSpace(text, at);
            if (!expect(text, at, k == 0 ? ',' : ']')) return null;
        }
        return at[0] == text.length() ? out : null;
    }

    private static boolean expect(String text, int[] at, char c) {
        if (at[0] < text.length() && text.charAt(at[0]) == c) {
            at[0]++;
            return true;
        }
        return false;
    }

    private static void skipSpace(String text, int[] at) {
        while (at[0] < text.length() && PyValues.pySpace(text.charAt(at[0]))) at[0]++;
    }

    /** {@code _binlog_index}: the trailing number of a binlog file name, 0 without one. */
    private BigInteger binlogIndex(String file) throws Dead {
        BigInteger index = binlogIndex.get(file);
        if (index == null) {
            Matcher m = TRAILING_DIGITS.matcher(file);
            String digits = m.find() ? m.group(1) : "0";
            int count = digits.codePointCount(0, digits.length());
            if (count > PyJson.MAX_INT_DIGITS) throw new Dead("out_of_range", "`source.file` ends in a number of " + count + " digits");
            StringBuilder ascii = new StringBuilder(count); // int() reads any script's decimal digits
            digits.codePoints().forEach(cp -> ascii.append((char) ('0' + Character.digit(cp, 10))));
            index = new BigInteger(ascii.toString());
            if (binlogIndex.size() >= MEMO_LIMIT) binlogIndex.clear();
            binlogIndex.put(file, index);
        }
        return index;
    }

    /** Python's {@code f"{n:0<width>d}"}: zero-padded to {@code width} characters, a minus sign counted in. */
    static String pad(Object n, int width) {
        String s = n.toString();
        if (s.length() >= width) return s;
        boolean negative = s.charAt(0) == '-';
        StringBuilder out = new StringBuilder(width);
        if (negative) out.append('-');
        for (int k = s.length(); k < width; k++) out.append('0');
        return out.append(s, negative ? 1 : 0, s.length()).toString();
    }

    private Object lastSchema; // the schema object the last row schema was written from (the memo hands out one per text)
    private String lastRowSchema;

    /** {@code _row_schema}: the Connect schema of the {@code after} (else {@code before}) field, canonical. */
    private String rowSchema(Object schema) throws PyWriter.TooDeep {
        if (schema != lastSchema) {
            String text = writeRowSchema(schema);
            lastSchema = schema;
            lastRowSchema = text;
        }
        return lastRowSchema;
    }

    @SuppressWarnings("unchecked")
    private String writeRowSchema(Object schema) throws PyWriter.TooDeep {
        if (!(schema instanceof Map)) return null;
        Object fields = ((Map<String, Object>) schema).get("fields");
        if (!(fields instanceof List)) return null;
        for (String wanted : new String[] {"after", "before"}) {
            for (Object field : (List<Object>) fields) {
                if (field instanceof Map && wanted.equals(((Map<String, Object>) field).get("field"))) return PyWriter.json(field, true, Limits.ROW_SCHEMA_DEPTH, memo);
            }
        }
        return null;
    }

    /** {@code normalise_transaction_id}: PostgreSQL {@code <txId>:<lsn>} to {@code <txId>}, any other id as is. */
    static String normaliseTransactionId(String text) {
        if (text == null) return null;
        Matcher m = PG_TX_ID.matcher(text);
        return m.lookingAt() ? m.group(1) : text;
    }

}
