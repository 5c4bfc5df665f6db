package cdc.platform.parse;

import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Map;

/**
 * The texts the Python parser writes: {@code json.dumps(obj, separators=(",", ":"), ensure_ascii=False)}
 * with or without {@code sort_keys} (row images, keys, identities; a {@link PyDecimal} written as its digits,
 * as simplejson writes it), {@code quote_value} (simplejson's default form with {@code ensure_ascii}), and
 * Python's {@code str()} / {@code repr()} of a value. Keys sort by code point, as Python sorts str.
 */
final class PyWriter {
    private PyWriter() {}

    /** Raised (as a sentinel, no stack) when a value nests deeper than Python writes ({@link Limits}). */
    static final class TooDeep extends Exception {
        TooDeep() {
            super("too deep", null, false, false);
        }
    }

    static final TooDeep TOO_DEEP_ERROR = new TooDeep();
    static final int TOO_DEEP = -2;

    /** Python's str ordering: by code point (Java's String order is by UTF-16 unit, which differs past U+FFFF). */
    static final Comparator<String> CODE_POINT_ORDER = (a, b) -> {
        int n = Math.min(a.length(), b.length());
        for (int i = 0; i < n; i++) {
            char x = a.charAt(i), y = b.charAt(i);
            if (x != y) {
                if (x >= 0xd800 && y >= 0xd800) {
                    x = (char) (x >= 0xe000 ? x - 0x800 : x + 0x2000);
                    y = (char) (y >= 0xe000 ? y - 0x800 : y + 0x2000);
                }
                return x - y;
            }
        }
        return a.length() - b.length();
    };

    // -- json.dumps ---------------------------------------------------------------------------------------

    /**
     * {@code json.dumps} in the raw log's compact form; {@code sorted}: the canonical form (identities, keys).
     * {@code maxDepth}: the containers Python writes at this call ({@link Limits}); one fewer for a value that
     * holds a {@link PyDecimal}, which simplejson writes one frame deeper.
     */
    static String json(Object value, boolean sorted, int maxDepth, Memo memo) throws TooDeep {
        StringBuilder out = new StringBuilder(128);
        new Depth(maxDepth, memo).json(out, value, sorted, 0, null);
        return out.toString();
    }

    /** The canonical JSON of {@code map} without the top-level keys in {@code skip}: an event's identity text. */
    static String canonicalWithout(Map<String, Object> map, List<String> skip, int maxDepth, Memo memo) throws TooDeep {
        StringBuilder out = new StringBuilder(256);
        new Depth(maxDepth, memo).json(out, map, true, 0, skip);
        return out.toString();
    }

    /**
     * One write's depth limit ({@link Limits}): at most {@code max} containers; with a Decimal anywhere in the value,
     * at most {@code max - 1}, a Decimal counting one level below its container. A write stops as soon as it
     * passes {@code max}; the Decimal rule is checked when it is done.
     */
    private static final class Depth {
        private final int max;
        private final Memo memo;
        private int deepest; // containers
        private int deepestDecimal = -1; // containers around the deepest Decimal

        Depth(int max, Memo memo) {
            this.max = max;
            this.memo = memo;
        }

        void enter(int depth) throws TooDeep {
            if (depth > max) throw TOO_DEEP_ERROR;
            if (depth > deepest) deepest = depth;
        }

        void decimal(int depth) {
            if (depth > deepestDecimal) deepestDecimal = depth;
        }

        void json(StringBuilder out, Object v, boolean sorted, int depth, List<String> skip) throws TooDeep {
            PyWriter.json(this, out, v, sorted, depth, skip);
            if (deepestDecimal >= 0 && (deepest > max - 1 || deepestDecimal + 1 > max - 1)) throw TOO_DEEP_ERROR;
        }
    }

    /** Whether Python's json.dumps of {@code v} stops for depth at this limit (the same rule as {@link Depth}). */
    static boolean tooDeep(Object v, int max) {
        int[] found = {0, -1};
        measure(v, 0, found, max + 1);
        if (found[0] > max) return true;
        return found[1] >= 0 && (found[0] > max - 1 || found[1] + 1 > max - 1);
    }

    @SuppressWarnings("unchecked")
    private static void measure(Object v, int depth, int[] found, int stop) {
        if (found[0] >= stop) return;
        if (v instanceof PyDecimal) {
            found[1] = Math.max(found[1], depth);
        } else if (v instanceof Map) {
            found[0] = Math.max(found[0], depth + 1);
            for (Object x : ((Map<String, Object>) v).values()) measure(x, depth + 1, found, stop);
        } else if (v instanceof List) {
            found[0] = Math.max(found[0], depth + 1);
            for (Object x : (List<Object>) v) measure(x, depth + 1, found, stop);
        }
    }

    @SuppressWarnings("unchecked")
    private static void json(Depth limit, StringBuilder out, Object v, boolean sorted, int depth, List<String> skip) throws TooDeep {
        if (v == null) {
            out.append("null");
        } else if (v instanceof String) {
            string(out, (String) v);
        } else if (v instanceof Map) {
            limit.enter(depth + 1);
            Map<String, Object> m = (Map<String, Object>) v;
            out.append('{');
            boolean first = true;
            if (sorted && m.size() > 1) {
                String[] keys;
                if (limit.memo != null) {
                    keys = limit.memo.sorted(m);
                } else {
                    keys = m.keySet().toArray(new String[0]);
                    Arrays.sort(keys, CODE_POINT_ORDER);
                }
                for (String k : keys) {
                    if (skip != null && skip.contains(k)) continue;
                    if (!first) out.append(',');
                    first = false;
                    string(out, k);
                    out.append(':');
                    json(limit, out, m.get(k), true, depth + 1, null);
                }
            } else {
                for (Map.Entry<String, Object> e : m.entrySet()) {
                    if (skip != null && skip.contains(e.getKey())) continue;
                    if (!first) out.append(',');
                    first = false;
                    string(out, e.getKey());
                    out.append(':');
                    json(limit, out, e.getValue(), sorted, depth + 1, null);
                }
            }
            out.append('}');
        } else if (v instanceof List) {
            limit.enter(depth + 1);
            List<Object> l = (List<Object>) v;
            out.append('[');
            for (int i = 0, n = l.size(); i < n; i++) {
                if (i > 0) out.append(',');
                json(limit, out, l.get(i), sorted, depth + 1, null);
            }
            out.append(']');
        } else if (v instanceof Long) {
            out.append(((Long) v).longValue());
        } else if (v instanceof Double) {
            PyFloat.append(out, (Double) v);
        } else if (v instanceof Boolean) {
            out.append(((Boolean) v) ? "true" : "false");
        } else {
            if (v instanceof PyDecimal) limit.decimal(depth);
            out.append(v.toString()); // BigInteger, PyDecimal
        }
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** A JSON string as Python writes it with {@code ensure_ascii=False}. */
    static void string(StringBuilder out, String s) {
        out.append('"');
        int n = s.length(), run = 0;
        for (int i = 0; i < n; i++) {
            char c = s.charAt(i);
            if (c >= 0x20 && c != '"' && c != '\\') continue;
            out.append(s, run, i);
            run = i + 1;
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                case '\b': out.append("\\b"); break;
                case '\f': out.append("\\f"); break;
                default: out.append("\\u00").append(HEX[c >> 4]).append(HEX[c & 15]);
            }
        }
        out.append(s, run, n).append('"');
    }

    // -- quote_value: simplejson.dumps(value, use_decimal=True, default=str, ensure_ascii=True) ---------------

    static String quote(Object v) {
        StringBuilder out = new StringBuilder(32);
        try {
            quote(out, v, 0);
        } catch (TooDeep e) {
            return out.toString(); // only ever cut to 40-80 characters: what was written is what is shown
        }
        return out.toString();
    }

    /** {@code quote_value(v)[:limit]}. */
    static String quote(Object v, int limit) {
        String s = quote(v);
        return s.length() > limit ? s.substring(0, limit) : s; // ASCII only: characters are code points
    }

    @SuppressWarnings("unchecked")
    private static void quote(StringBuilder out, Object v, int depth) throws TooDeep {
        if (out.length() > 200) throw TOO_DEEP_ERROR; // enough for any cut; stops early on a big value
        if (v == null) {
            out.append("null");
        } else if (v instanceof String) {
            asciiString(out, (String) v);
        } else if (v instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) out.append(", ");
                first = false;
                asciiString(out, e.getKey());
                out.append(": ");
                quote(out, e.getValue(), depth + 1);
            }
            out.append('}');
        } else if (v instanceof List) {
            out.append('[');
            List<Object> l = (List<Object>) v;
            for (int i = 0; i < l.size(); i++) {
                if (i > 0) out.append(", ");
                quote(out, l.get(i), depth + 1);
            }
            out.append(']');
        } else if (v instanceof Double) {
            PyFloat.append(out, (Double) v);
        } else if (v instanceof Boolean) {
            out.append(((Boolean) v) ? "true" : "false");
        } else {
            out.append(v.toString());
        }
    }

    private static void asciiString(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0, n = s.length(); i < n; i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                case '\b': out.append("\\b"); break;
                case '\f': out.append("\\f"); break;
                default:
                    if (c >= 0x20 && c <= 0x7e) out.append(c);
                    else out.append("\\u").append(HEX[c >> 12]).append(HEX[(c >> 8) & 15]).append(HEX[(c >> 4) & 15]).append(HEX[c & 15]);
            }
            if (out.length() > 400) break; // only a short prefix is ever shown
        }
        out.append('"');
    }

    // -- str() and repr() ---------------------------------------------------------------------------------

    /** Python's {@code str(v)} (an f-string's {@code {v}} too). */
    static String str(Object v) throws TooDeep {
        if (v instanceof String) return (String) v;
        StringBuilder out = new StringBuilder(32);
        repr(out, v, 0);
        return out.toString();
    }

    @SuppressWarnings("unchecked")
    private static void repr(StringBuilder out, Object v, int depth) throws TooDeep {
        if (v == null) {
            out.append("None");
        } else if (v instanceof String) {
            pyRepr(out, (String) v);
        } else if (v instanceof Boolean) {
            out.append(((Boolean) v) ? "True" : "False");
        } else if (v instanceof Double) {
            PyFloat.append(out, (Double) v);
        } else if (v instanceof Map) {
            if (depth + 1 > Limits.STR_DEPTH) throw TOO_DEEP_ERROR;
            out.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) out.append(", ");
                first = false;
                pyRepr(out, e.getKey());
                out.append(": ");
                repr(out, e.getValue(), depth + 1);
            }
            out.append('}');
        } else if (v instanceof List) {
            if (depth + 1 > Limits.STR_DEPTH) throw TOO_DEEP_ERROR;
            out.append('[');
            List<Object> l = (List<Object>) v;
            for (int i = 0; i < l.size(); i++) {
                if (i > 0) out.append(", ");
                repr(out, l.get(i), depth + 1);
            }
            out.append(']');
        } else if (v instanceof PyDecimal) {
            out.append("Decimal('").append(v).append("')");
        } else {
            out.append(v.toString()); // Long, BigInteger
        }
    }

    /** Python's {@code repr(str)}. */
    static void pyRepr(StringBuilder out, String s) {
        char quote = s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? '"' : '\'';
        out.append(quote);
        for (int i = 0; i < s.length(); ) {
            int c = s.codePointAt(i);
            i += Character.charCount(c);
            if (c == quote || c == '\\') out.append('\\').append((char) c);
            else if (c == '\t') out.append("\\t");
            else if (c == '\n') out.append("\\n");
            else if (c == '\r') out.append("\\r");
            else if (c < 0x20 || c == 0x7f) out.append("\\x").append(HEX[c >> 4]).append(HEX[c & 15]);
            else if (c < 0x7f) out.append((char) c);
            else if (printable(c)) out.appendCodePoint(c);
            else if (c <= 0xff) out.append("\\x").append(HEX[c >> 4]).append(HEX[c & 15]);
            else if (c <= 0xffff) out.append(String.format("\\u%04x", c));
            else out.append(String.format("\\U%08x", c));
        }
        out.append(quote);
    }

    /** Python's {@code str.isprintable} for one code point (Java's Unicode tables). */
    private static boolean printable(int c) {
        switch (Character.getType(c)) {
            case Character.CONTROL:
            case Character.FORMAT:
            case Character.SURROGATE:
            case Character.PRIVATE_USE:
            case Character.UNASSIGNED:
            case Character.LINE_SEPARATOR:
            case Character.PARAGRAPH_SEPARATOR:
            case Character.SPACE_SEPARATOR:
                return c == ' ';
            default:
                return true;
        }
    }

    // -- a lone surrogate, in the order json.dumps writes -----------------------------------------------------

    /**
     * The first unpaired surrogate in {@code v} as {@code json.dumps} writes it, -1 for none, or {@link #TOO_DEEP}
     * when that write stops first (it writes the whole value before the text is encoded).
     */
    static int firstLoneSurrogate(Object v, int maxDepth) {
        if (tooDeep(v, maxDepth)) return TOO_DEEP;
        return lone(v);
    }

    @SuppressWarnings("unchecked")
    private static int lone(Object v) {
        if (v instanceof String) return lone((String) v);
        if (v instanceof Map) {
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                int c = lone(e.getKey());
                if (c >= 0) return c;
                c = lone(e.getValue());
                if (c >= 0) return c;
            }
        } else if (v instanceof List) {
            for (Object x : (List<Object>) v) {
                int c = lone(x);
                if (c >= 0) return c;
            }
        }
        return -1;
    }

    private static int lone(String s) {
        for (int i = 0, n = s.length(); i < n; i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < n && Character.isLowSurrogate(s.charAt(i + 1))) {
                i++;
                continue;
            }
            if (Character.isSurrogate(c)) return c;
        }
        return -1;
    }
}
