package cdc.platform.parse;

/**
 * How deep the parser follows nested JSON, where Python's limits come from its interpreter's recursion limit.
 *
 * <p>The Python parser reads through orjson up to 1,024 levels ({@link PyJson#ORJSON_MAX_DEPTH}), and otherwise
 * (a line with a number no float holds, or one orjson refused) through the stdlib, whose C scanner stops at
 * Python's recursion limit (1,000) less the frames already on the stack. It writes a value with orjson up to
 * 255 levels and deeper ones with the stdlib encoder, under the same limit: so each write stops a frame or two
 * earlier or later depending on how deep its caller is; a value with a {@link PyDecimal} stops one level
 * earlier still (the stdlib refuses the Decimal and simplejson, one frame deeper, writes it again), and there
 * a Decimal counts as one level more than its container (simplejson calls its {@code str}).
 *
 * <p>The numbers here are what Python did on Spark's executors (the Arrow function over a batch of UTF-8
 * lines, measured with the test in tests/cdc_platform/test_jvm_parse.py): deeper than them a line is a
 * {@code too_deep} dead letter, as there. Python itself is not constant: in a batch holding a line that is
 * not UTF-8 every line goes two frames deeper ({@code parse_bytes}), so its limits drop by two; and in the
 * driver (a backfill, a test) they differ again. The JVM's do not move.
 */
final class Limits {
    private Limits() {}

    /** Containers the stdlib path reads (the C scanner counts one per object or array). */
    static final int MAX_READ_DEPTH = 973;
    /**
     * Levels a number with a fraction or exponent costs on the stdlib path, where the scanner calls Python's
     * {@code _exact_float} (and {@code _reject_constant} for NaN and the infinities): two, and three when it
     * compares Decimals (a text longer than 16 characters or with an exponent).
     */
    static final int FLOAT_CALL_COST = 2, DECIMAL_CALL_COST = 3;
    /** Containers of an event's identity, written by {@code _stdlib_dumps} straight from {@code _parse_change}. */
    static final int IDENTITY_DEPTH = 970;
    /** A key, a row image ({@code canonical_json}, {@code _text}): one frame deeper than the identity. */
    static final int TEXT_DEPTH = IDENTITY_DEPTH - 1;
    /** The Connect schema of the row ({@code _row_schema} calls {@code canonical_json}): two frames deeper. */
    static final int ROW_SCHEMA_DEPTH = IDENTITY_DEPTH - 2;
    /** The lone-surrogate check's write in {@code _loads}: a frame above {@code _parse_change}. */
    static final int READ_CHECK_DEPTH = IDENTITY_DEPTH + 1;
    /** Python's {@code str()} of a nested value (C recursion only, as the scanner's). */
    static final int STR_DEPTH = MAX_READ_DEPTH;
}
