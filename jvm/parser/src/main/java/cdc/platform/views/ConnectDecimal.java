package cdc.platform.views;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.RoundingMode;
import java.util.Base64;

/**
 * Connect's decimals as exact text, for the views' SQL (cdc_platform/views/connect_sql.py), which calls these
 * through Spark's {@code try_reflect}: a static method of strings and ints is what {@code reflect} can call, and
 * a class on the session's class path is what a persistent view in {@code cdc serve}'s catalog can name (it
 * cannot name a temporary function). The text is what the latest state stores, as Python's
 * {@code format(Decimal(unscaled).scaleb(-scale), 'f')} and {@code format(value.quantize(...), 'f')} write it
 * (cdc_platform/stages/latest_state/connect_types.py); tests/cdc_platform/test_connect_sql.py holds the two to
 * the same values.
 *
 * <p>Why not SQL: the same conversions written in Spark SQL (hex digits, two's complement, padding) came to
 * kilobytes per text column, and Spark analyses and optimises every copy on each query of a view: a point
 * lookup on a full view spent more time planning them than reading its rows. A value these methods refuse
 * throws, which {@code try_reflect} turns into NULL (the latest state dead-letters such a value).
 */
public final class ConnectDecimal {
    /** As connect_types.MAX_TEXT_SCALE: a larger scale (a corrupt one) would make a text of as many characters. */
    static final int MAX_TEXT_SCALE = 100_000;

    private ConnectDecimal() {}

    /**
     * A Connect Decimal's value (big-endian two's complement bytes of the unscaled value, in base64) at
     * {@code scale}, written out with {@code scale} digits after the point (none for a negative scale, whose
     * zeros are written before it). Any number of digits: a VariableScaleDecimal or a 60-digit numeric.
     */
    public static String plain(String base64, int scale) {
        checkScale(scale);
        byte[] bytes = Base64.getDecoder().decode(base64);
        BigInteger unscaled = bytes.length == 0 ? BigInteger.ZERO : new BigInteger(bytes);
        return new BigDecimal(unscaled, scale).toPlainString();
    }

    /**
     * A Decimal sent as a JSON number (decimal.format=NUMERIC), given as its decimal text without an exponent,
     * with exactly {@code scale} digits after the point; refused (an exception) where that would drop a digit.
     * A negative zero keeps its sign, as Python's Decimal does.
     */
    public static String quantized(String number, int scale) {
        checkScale(scale);
        BigDecimal value = new BigDecimal(number).setScale(scale, RoundingMode.UNNECESSARY);
        String text = value.toPlainString();
        return value.signum() == 0 && number.startsWith("-") ? "-" + text : text;
    }

    private static void checkScale(int scale) {
        if (Math.abs((long) scale) > MAX_TEXT_SCALE) throw new ArithmeticException("scale " + scale + " is beyond " + MAX_TEXT_SCALE);
    }
}
