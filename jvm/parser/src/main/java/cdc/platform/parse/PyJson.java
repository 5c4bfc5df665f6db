package cdc.platform.parse;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * JSON text read as the Python parser reads it ({@code json_codec._loads}), straight from its UTF-8 bytes.
 *
 * <p>Values are Python's: {@code null}, {@link Boolean}, {@link Long} (an int in 64 bits), {@link BigInteger}
 * (a larger int), {@link Double}, {@link PyDecimal}, {@link String}, {@link LinkedHashMap} (a dict: a repeated
 * key keeps its first place and its last value) and {@link ArrayList}.
 *
 * <p>Python reads a line through orjson when that gives the same objects, else through the stdlib's
 * decoder whose numbers are exact. The two differ on numbers with a fraction or an exponent: orjson reads
 * every one as a float, the stdlib path keeps the digits no float holds ({@link PyFloat#exact}). Which path a
 * line takes is {@code _orjson_may_misread}'s decision ({@link #mayMisread}), made here the same way, and
 * whatever orjson refuses (bad JSON, NaN, a lone surrogate, a float past the largest, deep nesting) goes the
 * stdlib's way, whose errors are the reasons' texts: CPython 3.11's scanner ({@code Modules/_json.c}) is
 * followed for every message and position (a position counts code points, as Python's str index does).
 */
final class PyJson {
    /** Python's {@code sys.int_info.default_max_str_digits}: int() refuses longer digit strings. */
    static final int MAX_INT_DIGITS = 4300;
    /** orjson's nesting limit: deeper lines go the stdlib's way. */
    static final int ORJSON_MAX_DEPTH = 1024;

    /** A failure to read: a {@link Dead} reason, or, on the float path, a sign to read the line the exact way. */
    static final class Failure extends Exception {
        final Dead dead; // null: leave the float path

        Failure(Dead dead) {
            super(null, null, false, false);
            this.dead = dead;
        }
    }

    private static final Failure LEAVE_FLOAT_PATH = new Failure(null);

    private final byte[] b;
    private final int start; // index 0 of the text (after a byte-order mark)
    private final int end;
    private final boolean floats; // orjson's path: fractions and exponents as floats
    private final int maxDepth;
    private final Memo memo;
    private int depth;
    private int next; // the scanner's next_idx
    boolean loneSurrogate; // a \\u escape left a surrogate unpaired somewhere
    boolean decimals; // a PyDecimal was read somewhere
    boolean sawFloat; // a number with a fraction or an exponent was read somewhere
    int deepest; // the most containers open at once

    private PyJson(byte[] b, int start, int end, boolean floats, int maxDepth, Memo memo) {
        this.memo = memo;
        this.b = b;
        this.start = start;
        this.end = end;
        this.floats = floats;
        this.maxDepth = maxDepth;
    }

    /** What {@link #read} returns: the value, and what the writer needs to know of it. */
    static final class Document {
        final Object value;
        final boolean decimals;

        Document(Object value, boolean decimals) {
            this.value = value;
            this.decimals = decimals;
        }
    }

    /**
     * {@code _loads(text)} for the well-formed UTF-8 bytes {@code [start, end)}: the value, or the dead letter
     * Python makes of the failure ({@code not_json}, {@code out_of_range}, {@code lone_surrogate}, {@code too_deep}).
     */
    static Document read(byte[] b, int start, int end, Memo memo) throws Dead {
        // orjson's way first. Which way Python takes (`_orjson_may_misread`, a scan of the whole text) matters only
        // for a line with a fraction or an exponent in it, or nested past the stdlib's depth: only then is it asked.
        PyJson floatPath = new PyJson(b, start, end, true, ORJSON_MAX_DEPTH, memo);
        try {
            Object value = floatPath.document();
            if ((!floatPath.sawFloat && floatPath.deepest <= Limits.MAX_READ_DEPTH) || !mayMisread(b, start, end)) {
                return new Document(value, false);
            }
        } catch (Failure f) {
            // orjson refused the line: the stdlib reads it and words the error
        }
        PyJson exact = new PyJson(b, start, end, false, Limits.MAX_READ_DEPTH, memo);
        Object value;
        try {
            value = exact.document();
        } catch (Failure f) {
            throw f.dead;
        }
        if (exact.loneSurrogate) {
            int c = PyWriter.firstLoneSurrogate(value, Limits.READ_CHECK_DEPTH);
            if (c == PyWriter.TOO_DEEP) throw new Dead("too_deep", "while reading");
            if (c >= 0) throw new Dead("lone_surrogate", String.format("U+%04X", c));
        }
        return new Document(value, exact.decimals);
    }

    private Object document() throws Failure {
        int idx = skipWhitespace(start);
        Object value = scanOnce(idx);
        int after = skipWhitespace(next);
        if (after != end) throw error("Extra data", after);
        return value;
    }

    // -- errors -------------------------------------------------------------------------------------------

    private Failure error(String message, int at) {
        if (floats) return LEAVE_FLOAT_PATH;
        int pos = Utf8.codePoints(b, start, at);
        int line = 1, lastNewline = -1;
        for (int i = start; i < at; i++) {
            if (b[i] == '\n') {
                line++;
                lastNewline = i;
            }
        }
        int column = lastNewline < 0 ? pos + 1 : pos - Utf8.codePoints(b, start, lastNewline);
        return notJson(message + ": line " + line + " column " + column + " (char " + pos + ")");
    }

    /** A ValueError's text as {@code parse_line} quotes it: its first 120 characters. */
    private static Failure notJson(String text) {
        return new Failure(new Dead("not_json", text.length() > 120 ? text.substring(0, 120) : text));
    }

    private Failure stop(int at) {
        return error("Expecting value", at);
    }

    // -- the scanner -------------------------------------------------------------------------------------

    private int skipWhitespace(int i) {
        while (i < end) {
            byte c = b[i];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') i++;
            else break;
        }
        return i;
    }

    private boolean at(int i, char c) {
        return i < end && b[i] == c;
    }

    private boolean follows(int i, String word) {
        if (i + word.length() > end) return false;
        for (int k = 0; k < word.length(); k++) if (b[i + k] != word.charAt(k)) return false;
        return true;
    }

    private Object scanOnce(int idx) throws Failure {
        if (idx >= end) throw stop(idx);
        switch (b[idx]) {
            case '"':
                return scanString(idx + 1, false);
            case '{':
                enter();
                Object obj = parseObject(idx + 1);
                depth--;
                return obj;
            case '[':
                enter();
                Object arr = parseArray(idx + 1);
                depth--;
                return arr;
            case 'n':
                if (follows(idx + 1, "ull")) { next = idx + 4; return null; }
                break;
            case 't':
                if (follows(idx + 1, "rue")) { next = idx + 4; return Boolean.TRUE; }
                break;
            case 'f':
                if (follows(idx + 1, "alse")) { next = idx + 5; return Boolean.FALSE; }
                break;
            case 'N':
                if (follows(idx + 1, "aN")) throw constant("NaN");
                break;
            case 'I':
                if (follows(idx + 1, "nfinity")) throw constant("Infinity");
                break;
            case '-':
                if (follows(idx + 1, "Infinity")) throw constant("-Infinity");
                break;
            default:
                break;
        }
        return number(idx);
    }

    private Failure constant(String name) {
        if (floats) return LEAVE_FLOAT_PATH;
        if (depth + Limits.FLOAT_CALL_COST > maxDepth) return new Failure(new Dead("too_deep", "while reading"));
        return notJson("non-standard constant " + name);
    }

    private void enter() throws Failure {
        if (++depth > deepest) deepest = depth;
        if (depth > maxDepth) {
            if (floats) throw LEAVE_FLOAT_PATH;
            throw new Failure(new Dead("too_deep", "while reading"));
        }
    }

    private Object parseObject(int idx) throws Failure {
        Map<String, Object> out = new LinkedHashMap<>();
        idx = skipWhitespace(idx);
        if (idx >= end || b[idx] != '}') {
            while (true) {
                if (idx >= end || b[idx] != '"') throw error("Expecting property name enclosed in double quotes", idx);
                String key = scanString(idx + 1, true);
                idx = skipWhitespace(next);
                if (idx >= end || b[idx] != ':') throw error("Expecting ':' delimiter", idx);
                idx = skipWhitespace(idx + 1);
                Object value = memo != null && depth <= Memo.SCHEMA_DEPTH && key.equals("schema") && at(idx, '{') ? schema(idx) : scanOnce(idx);
                out.put(key, value);
                idx = skipWhitespace(next);
                if (at(idx, '}')) break;
                if (idx >= end || b[idx] != ',') throw error("Expecting ',' delimiter", idx);
                idx = skipWhitespace(idx + 1);
            }
        }
        next = idx + 1;
        return out;
    }

    /**
     * The Connect schema object at {@code idx} (the JSON converter's {@code "schema"}: the same few kilobytes in front
     * of every record of a table, most of a line), read once per task: bytes equal to a schema already read here,
     * at the same depth and on the same path, are that schema, since a JSON value's extent and value are its bytes'
     * alone. What reading it set (a float seen, a decimal, a lone surrogate, how deep it went) is set again.
     */
    private Object schema(int idx) throws Failure {
        Memo.Schema known = memo.schema(b, idx, end, depth, floats);
        if (known != null) {
            next = idx + known.bytes().length;
            sawFloat |= known.sawFloat();
            decimals |= known.decimals();
            loneSurrogate |= known.loneSurrogate();
            deepest = Math.max(deepest, known.deepest());
            return known.value();
        }
        boolean sawFloat0 = sawFloat, decimals0 = decimals, loneSurrogate0 = loneSurrogate;
        int deepest0 = deepest;
        sawFloat = decimals = loneSurrogate = false;
        deepest = depth;
        Object value = scanOnce(idx);
        if (Memo.worthRemembering(next - idx)) {
            memo.remember(new Memo.Schema(java.util.Arrays.copyOfRange(b, idx, next), depth, floats, value, sawFloat, decimals, loneSurrogate, deepest));
        }
        sawFloat |= sawFloat0;
        decimals |= decimals0;
        loneSurrogate |= loneSurrogate0;
        deepest = Math.max(deepest, deepest0);
        return value;
    }

    private Object parseArray(int idx) throws Failure {
        List<Object> out = new ArrayList<>();
        idx = skipWhitespace(idx);
        if (idx >= end || b[idx] != ']') {
            while (true) {
                out.add(scanOnce(idx));
                idx = skipWhitespace(next);
                if (at(idx, ']')) break;
                if (idx >= end || b[idx] != ',') throw error("Expecting ',' delimiter", idx);
                idx = skipWhitespace(idx + 1);
            }
        }
        next = idx + 1;
        return out;
    }

    private static boolean digit(byte c) {
        return c >= '0' && c <= '9';
    }

    private Object number(int start0) throws Failure {
        int idx = start0;
        int last = end - 1; // end_idx
        if (b[idx] == '-') {
            idx++;
            if (idx > last) throw stop(start0);
        }
        if (b[idx] >= '1' && b[idx] <= '9') {
            idx++;
            while (idx <= last && digit(b[idx])) idx++;
        } else if (b[idx] == '0') {
            idx++;
        } else {
            throw stop(start0);
        }
        boolean isFloat = false;
        if (idx < last && b[idx] == '.' && digit(b[idx + 1])) {
            isFloat = true;
            idx += 2;
            while (idx <= last && digit(b[idx])) idx++;
        }
        if (idx < last && (b[idx] == 'e' || b[idx] == 'E')) {
            int eStart = idx;
            idx++;
            if (idx < last && (b[idx] == '-' || b[idx] == '+')) idx++;
            while (idx <= last && digit(b[idx])) idx++;
            if (digit(b[idx - 1])) isFloat = true;
            else idx = eStart;
        }
        next = idx;
        String text = new String(b, start0, idx - start0, java.nio.charset.StandardCharsets.ISO_8859_1);
        if (isFloat) {
            sawFloat = true;
            if (floats) {
                double v = Double.parseDouble(text);
                if (Double.isInfinite(v)) throw LEAVE_FLOAT_PATH;
                return v;
            }
            boolean decimalCompare = text.length() > 16 || text.indexOf('e') >= 0 || text.indexOf('E') >= 0;
            if (depth + (decimalCompare ? Limits.DECIMAL_CALL_COST : Limits.FLOAT_CALL_COST) > maxDepth) {
                throw new Failure(new Dead("too_deep", "while reading"));
            }
            Object v = PyFloat.exact(text);
            if (v == null) {
                String shown = text.length() > 40 ? text.substring(0, 40) : text;
                throw new Failure(new Dead("out_of_range", "the number " + shown + " does not fit a 64-bit float"));
            }
            if (v instanceof PyDecimal) decimals = true;
            return v;
        }
        int digits = text.length() - (text.charAt(0) == '-' ? 1 : 0);
        if (digits > MAX_INT_DIGITS) {
            if (floats) throw LEAVE_FLOAT_PATH;
            throw notJson("Exceeds the limit (" + MAX_INT_DIGITS + " digits) for integer string conversion: value has " + digits
                    + " digits; use sys.set_int_max_str_digits() to increase the limit");
        }
        if (digits <= 18) return Long.parseLong(text);
        BigInteger big = new BigInteger(text);
        return big.bitLength() < 64 ? (Object) big.longValue() : big;
    }

    /** The string whose opening quote is just before {@code from}; sets {@link #next} after its closing quote. */
    private String scanString(int from, boolean key) throws Failure {
        int begin = from - 1;
        int chunk = from;
        int i = from;
        StringBuilder out = null;
        while (true) {
            while (i < end) {
                byte c = b[i];
                if (c == '"' || c == '\\') break;
                if (c >= 0 && c <= 0x1f) throw error("Invalid control character at", i);
                i++;
            }
            if (i >= end) throw error("Unterminated string starting at", begin);
            if (b[i] == '"' && out == null) {
                next = i + 1;
                return key ? keyText(chunk, i) : text(chunk, i);
            }
            if (out == null) out = new StringBuilder(Math.max(16, (i - chunk) * 2));
            if (i != chunk) out.append(text(chunk, i));
            if (b[i] == '"') {
                next = i + 1;
                return out.toString();
            }
            // a backslash
            int escape = i + 1;
            if (escape >= end) throw error("Unterminated string starting at", begin);
            byte c = b[escape];
            if (c != 'u') {
                char ch;
                switch (c) {
                    case '"': ch = '"'; break;
                    case '\\': ch = '\\'; break;
                    case '/': ch = '/'; break;
                    case 'b': ch = '\b'; break;
                    case 'f': ch = '\f'; break;
                    case 'n': ch = '\n'; break;
                    case 'r': ch = '\r'; break;
                    case 't': ch = '\t'; break;
                    default: throw error("Invalid \\escape", i);
                }
                out.append(ch);
                i = escape + 1;
                chunk = i;
                continue;
            }
            // \\uXXXX: four hex digits, and at least one more character after them (CPython's `end >= len`)
            int hex = escape + 1;
            if (Utf8.advance(b, hex, end, 5) < 0) throw error("Invalid \\uXXXX escape", escape);
            int cp = hex4(hex);
            if (cp < 0) throw error("Invalid \\uXXXX escape", escape);
            int after = hex + 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                // a pair when "\\uXXXX" of a low surrogate follows, with at least one more character after it
                if (Utf8.advance(b, after, end, 7) >= 0 && b[after] == '\\' && b[after + 1] == 'u') {
                    int low = hex4(after + 2);
                    if (low < 0) throw error("Invalid \\uXXXX escape", after + 1);
                    if (low >= 0xdc00 && low <= 0xdfff) {
                        out.appendCodePoint(0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00));
                        i = after + 6;
                        chunk = i;
                        continue;
                    }
                }
            }
            if (cp >= 0xd800 && cp <= 0xdfff) {
                loneSurrogate = true;
                if (floats) throw LEAVE_FLOAT_PATH;
            }
            out.append((char) cp);
            i = after;
            chunk = i;
        }
    }

    private int hex4(int at) {
        int v = 0;
        for (int k = 0; k < 4; k++) {
            byte c = b[at + k];
            int d;
            if (c >= '0' && c <= '9') d = c - '0';
            else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
            else return -1;
            v = (v << 4) | d;
        }
        return v;
    }

    private String keyText(int from, int to) {
        if (memo == null) return text(from, to);
        for (int i = from; i < to; i++) {
            if (b[i] < 0) return Utf8.decode(b, from, to);
        }
        return memo.key(b, from, to);
    }

    private String text(int from, int to) {
        for (int i = from; i < to; i++) {
            if (b[i] < 0) return Utf8.decode(b, from, to);
        }
        return new String(b, from, to - from, java.nio.charset.StandardCharsets.ISO_8859_1);
    }

    // -- which path: json_codec._orjson_may_misread ---------------------------------------------------------

    /** `_LONG_FLOAT` and `_ORJSON_UNSAFE_INPUT` for lines that are not ASCII (str patterns: Unicode \\d, \\s). */
    private static final Pattern LONG_FLOAT = Pattern.compile("[0-9]{8}\\.|\\.[0-9]{8}|[0-9][eE]-[0-9]{3}");
    static final String PY_SPACE = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
    private static final Pattern UNSAFE_INPUT = Pattern.compile("[:,\\[][" + PY_SPACE + "]*(?:\\p{Nd}{20}|-\\p{Nd}{19})");

    /** {@code json_codec._orjson_may_misread}: true when orjson could read a number of the line differently. */
    static boolean mayMisread(byte[] b, int start, int end) {
        if (!Utf8.isAscii(b, start, end)) {
            String line = Utf8.decode(b, start, end);
            return LONG_FLOAT.matcher(line).find() || UNSAFE_INPUT.matcher(line).find();
        }
        // "00000000." / ".00000000" / "0e-000" in the line's shape (digits as 0), and a run of 19 digits
        int run = 0;
        boolean nineteen = false;
        for (int i = start; i < end; i++) {
            byte c = b[i];
            if (digit(c)) {
                if (++run >= 19) nineteen = true;
                continue;
            }
            if (c == '.') {
                if (run >= 8) return true;
                if (i + 8 < end + 0 && eightDigits(b, i + 1, end)) return true;
            } else if ((c == 'e' || c == 'E') && run >= 1 && i + 4 < end + 0 && b[i + 1] == '-'
                    && digit(b[i + 2]) && digit(b[i + 3]) && digit(b[i + 4])) {
                return true;
            }
            run = 0;
        }
        if (!nineteen) return false;
        for (int i = start; i < end; i++) {
            byte c = b[i];
            if (c != ':' && c != ',' && c != '[') continue;
            int j = i + 1;
            while (j < end && asciiPySpace(b[j])) j++;
            int k = j;
            if (k < end && b[k] == '-') {
                k++;
                if (runOfDigits(b, k, end) >= 19) return true;
            } else if (runOfDigits(b, k, end) >= 20) {
                return true;
            }
        }
        return false;
    }

    private static boolean eightDigits(byte[] b, int from, int end) {
        if (from + 8 > end) return false;
        for (int k = 0; k < 8; k++) if (!digit(b[from + k])) return false;
        return true;
    }

    private static int runOfDigits(byte[] b, int from, int end) {
        int i = from;
        while (i < end && digit(b[i])) i++;
        return i - from;
    }

    private static boolean asciiPySpace(byte c) {
        return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
    }
}
