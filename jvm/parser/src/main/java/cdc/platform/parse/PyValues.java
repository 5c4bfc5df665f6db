package cdc.platform.parse;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/** How the Python parser reads a JSON value where it wants a number, a time, a truth value or a type's name. */
final class PyValues {
    private PyValues() {}

    private static final Pattern INT_TEXT = Pattern.compile("-?[0-9]{1,39}");

    private static final BigInteger INT64_MIN = BigInteger.valueOf(Long.MIN_VALUE), INT64_MAX = BigInteger.valueOf(Long.MAX_VALUE);

    /** {@code _as_int}: ints and integral numeric strings (some converters stringify int64); the rest is refused. */
    static Long asInt(Object value, String field) throws Dead {
        if (value instanceof Long) return (Long) value;
        if (value == null) return null;
        if (value instanceof Boolean) throw new Dead("invalid_field", "`" + field + "` is a boolean, expected a number");
        BigInteger number;
        if (value instanceof BigInteger) {
            number = (BigInteger) value;
        } else if (value instanceof Double && Math.rint((Double) value) == (Double) value) {
            number = new BigDecimal((Double) value).toBigInteger();
        } else if (value instanceof String && INT_TEXT.matcher(pyStrip((String) value)).matches()) {
            number = new BigInteger(pyStrip((String) value));
        } else {
            throw new Dead("invalid_field", "`" + field + "` is " + PyWriter.quote(value, 60) + ", expected an integer");
        }
        if (number.compareTo(INT64_MIN) < 0 || number.compareTo(INT64_MAX) > 0) {
            String s = number.toString();
            throw new Dead("out_of_range", "`" + field + "` is " + (s.length() > 40 ? s.substring(0, 40) : s) + ", outside the signed 64-bit range");
        }
        return number.longValue();
    }

    /** {@code _as_ts_ms}: epoch milliseconds that a date and a microsecond timestamp can hold. */
    static Long asTsMs(Object value, String field) throws Dead {
        if (value instanceof Long && (Long) value >= Envelope.MIN_TS_MS && (Long) value <= Envelope.MAX_TS_MS) return (Long) value;
        Long ms = asInt(value, field);
        if (ms != null && (ms < Envelope.MIN_TS_MS || ms > Envelope.MAX_TS_MS)) {
            throw new Dead("out_of_range", "`" + field + "` is " + ms + ", not epoch milliseconds between the years 1 and 9999");
        }
        return ms;
    }

    /** Python's truth value of a JSON value. */
    @SuppressWarnings("unchecked")
    static boolean truthy(Object v) {
        if (v == null) return false;
        if (v instanceof Boolean) return (Boolean) v;
        if (v instanceof Long) return (Long) v != 0;
        if (v instanceof Double) return (Double) v != 0.0;
        if (v instanceof String) return !((String) v).isEmpty();
        if (v instanceof Map) return !((Map<String, Object>) v).isEmpty();
        if (v instanceof List) return !((List<Object>) v).isEmpty();
        return true; // a BigInteger beyond 64 bits, a PyDecimal: never zero
    }

    /** {@code _json_type}: how a reason names a value's JSON type (a dict and None are both "null" there). */
    static String jsonType(Object v) {
        if (v instanceof List) return "array";
        if (v instanceof String) return "string";
        if (v instanceof Boolean) return "boolean";
        if (v instanceof Long || v instanceof BigInteger || v instanceof Double || v instanceof PyDecimal) return "number";
        return "null";
    }

    /** Python's {@code str.strip()}: Unicode whitespace off both ends. */
    static String pyStrip(String s) {
        int i = 0, j = s.length();
        while (i < j && pySpace(s.charAt(i))) i++;
        while (j > i && pySpace(s.charAt(j - 1))) j--;
        return s.substring(i, j);
    }

    static boolean pySpace(char c) {
        return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 || c == 0x1680
                || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
    }
}
