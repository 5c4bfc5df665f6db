package cdc.platform.parse;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * What one parser (one Spark task) remembers from line to line, as the Python module memoises table ids:
 * the object keys it has read (the same dozen names on every line of a table, so each becomes one String,
 * hashed once), and the sorted order of each set of keys the canonical JSON writes. Both are bounded; a
 * miss costs only the work the memo saves. Not thread-safe: one per task.
 */
final class Memo {
    private static final int KEY_SLOTS = 2048; // a power of two
    private static final int MAX_KEY_BYTES = 64;
    private static final int MAX_ORDERS = 1024;

    private final byte[][] keyBytes = new byte[KEY_SLOTS][];
    private final String[] keys = new String[KEY_SLOTS];
    private final Map<List<String>, String[]> orders = new HashMap<>();

    /** The ASCII key {@code b[from, to)} as a String, the same String each time it comes back. */
    String key(byte[] b, int from, int to) {
        int n = to - from;
        if (n > MAX_KEY_BYTES) return new String(b, from, n, StandardCharsets.ISO_8859_1);
        int h = 0x811c9dc5;
        for (int i = from; i < to; i++) h = (h ^ b[i]) * 0x01000193;
        int slot = (h ^ (h >>> 16)) & (KEY_SLOTS - 1);
        byte[] known = keyBytes[slot];
        if (known != null && Arrays.equals(known, 0, known.length, b, from, to)) return keys[slot];
        String s = new String(b, from, n, StandardCharsets.ISO_8859_1);
        keyBytes[slot] = Arrays.copyOfRange(b, from, to);
        keys[slot] = s;
        return s;
    }

    /** Schemas are looked for no deeper than this: the top object's, or a key/value wrapper's. */
    static final int SCHEMA_DEPTH = 2;
    private static final int SCHEMA_SLOTS = 16; // the tables one task meets, most of the time
    private static final int MIN_SCHEMA_BYTES = 128; // shorter ones read faster than they are looked up

    /** A schema object read once: its bytes, where and how it was read, the value and what reading it set. */
    record Schema(byte[] bytes, int depth, boolean floats, Object value, boolean sawFloat, boolean decimals, boolean loneSurrogate,
                  int deepest) {}

    /** Whether a schema of {@code length} bytes is worth remembering (and its bytes copying). */
    static boolean worthRemembering(int length) {
        return length >= MIN_SCHEMA_BYTES;
    }

    private final Schema[] schemas = new Schema[SCHEMA_SLOTS];
    private int nextSlot;

    /** The schema read before whose bytes start {@code b} at {@code from}, read at this depth on this path, or null. */
    Schema schema(byte[] b, int from, int end, int depth, boolean floats) {
        for (Schema s : schemas) {
            if (s == null) return null;
            int to = from + s.bytes.length;
            if (s.depth == depth && s.floats == floats && to <= end && Arrays.equals(s.bytes, 0, s.bytes.length, b, from, to)) {
                return s;
            }
        }
        return null;
    }

    void remember(Schema s) {
        schemas[nextSlot] = s;
        nextSlot = (nextSlot + 1) % SCHEMA_SLOTS;
    }

    /** The keys of {@code m} in Python's sort order (by code point). */
    String[] sorted(Map<String, Object> m) {
        List<String> names = new ArrayList<>(m.keySet());
        String[] order = orders.get(names);
        if (order == null) {
            order = names.toArray(new String[0]);
            Arrays.sort(order, PyWriter.CODE_POINT_ORDER);
            if (orders.size() >= MAX_ORDERS) orders.clear();
            orders.put(names, order);
        }
        return order;
    }
}
