package cdc.platform.parse;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.RoundingMode;

/**
 * Python's text of a 64-bit float: {@code repr(x)}, which {@code json.dumps} writes. Its digits are the
 * shortest that read back as the same float, the nearest to it when several are as short (David Gay's
 * mode 0); Java 17's {@code Double.toString} is not always the shortest (JDK-4511638), so the digits are
 * found here with exact decimal arithmetic, and Java's text only says where to start looking.
 */
final class PyFloat {
    private PyFloat() {}

    /** Decimal digits without trailing zeros and the place of the point: the value is 0.DIGITS x 10^point. */
    static final class Digits {
        final String digits;
        final int point;

        Digits(String digits, int point) {
            this.digits = digits;
            this.point = point;
        }
    }

    private static final double TWO_53 = 9007199254740992.0;

    /** {@code repr(x)} for a finite {@code x}. */
    static String repr(double x) {
        StringBuilder out = new StringBuilder(24);
        append(out, x);
        return out.toString();
    }

    static void append(StringBuilder out, double x) {
        if (x == 0) {
            out.append(Double.doubleToRawLongBits(x) < 0 ? "-0.0" : "0.0");
            return;
        }
        if (x < 0) {
            out.append('-');
            x = -x;
        }
        Digits d = shortest(x);
        String s = d.digits;
        int n = s.length(), point = d.point;
        if (point <= -4 || point > 16) {
            out.append(s.charAt(0));
            if (n > 1) out.append('.').append(s, 1, n);
            int e = point - 1;
            out.append('e').append(e < 0 ? '-' : '+');
            int ae = Math.abs(e);
            if (ae < 10) out.append('0');
            out.append(ae);
        } else if (point <= 0) {
            out.append("0.");
            for (int i = 0; i < -point; i++) out.append('0');
            out.append(s);
        } else if (point >= n) {
            out.append(s);
            for (int i = n; i < point; i++) out.append('0');
            out.append(".0");
        } else {
            out.append(s, 0, point).append('.').append(s, point, n);
        }
    }

    /** The shortest digits of a positive finite {@code x} that read back as {@code x}. */
    static Digits shortest(double x) {
        if (x < TWO_53 && x == Math.rint(x)) {
            String s = Long.toString((long) x);
            int end = s.length();
            while (end > 1 && s.charAt(end - 1) == '0') end--;
            return new Digits(s.substring(0, end), s.length());
        }
        BigDecimal exact = new BigDecimal(x);
        int adjusted = exact.precision() - exact.scale() - 1; // floor(log10(x))
        int n = significantDigits(Double.toString(x));
        Digits best = null;
        for (int p = n - 1; p >= 1; p--) {
            Digits c = candidate(exact, adjusted, x, p);
            if (c == null) break;
            best = c;
        }
        if (best != null) return best;
        for (int p = n; p <= 17; p++) {
            Digits c = candidate(exact, adjusted, x, p);
            if (c != null) return c;
        }
        throw new IllegalStateException("no decimal of up to 17 digits reads back as " + x);
    }

    private static int significantDigits(String javaText) {
        int e = javaText.indexOf('E');
        String mantissa = e < 0 ? javaText : javaText.substring(0, e);
        int first = -1, last = -1;
        for (int i = 0; i < mantissa.length(); i++) {
            char c = mantissa.charAt(i);
            if (c >= '1' && c <= '9') {
                if (first < 0) first = i;
                last = i;
            }
        }
        if (first < 0) return 1;
        int count = 0;
        for (int i = first; i <= last; i++) if (Character.isDigit(mantissa.charAt(i))) count++;
        return Math.max(count, 1);
    }

    /**
     * The {@code p}-digit decimal nearest to {@code x} among the two around it that read back as {@code x}
     * (ties to an even last digit), or null when neither does. Only these two can: any other {@code p}-digit
     * decimal is farther from {@code x} on the same side as one of them.
     */
    private static Digits candidate(BigDecimal exact, int adjusted, double x, int p) {
        int scale = p - 1 - adjusted;
        BigDecimal lo = exact.setScale(scale, RoundingMode.FLOOR);
        if (lo.compareTo(exact) == 0) return digitsOf(lo);
        BigDecimal hi = lo.add(BigDecimal.ONE.scaleByPowerOfTen(-scale));
        boolean loOk = lo.signum() > 0 && Double.parseDouble(lo.toString()) == x;
        boolean hiOk = Double.parseDouble(hi.toString()) == x;
        if (loOk && hiOk) {
            int cmp = exact.subtract(lo).compareTo(hi.subtract(exact));
            if (cmp < 0) return digitsOf(lo);
            if (cmp > 0) return digitsOf(hi);
            return lo.unscaledValue().testBit(0) ? digitsOf(hi) : digitsOf(lo);
        }
        if (loOk) return digitsOf(lo);
        if (hiOk) return digitsOf(hi);
        return null;
    }

    private static Digits digitsOf(BigDecimal v) {
        String s = v.unscaledValue().toString();
        int point = s.length() - v.scale();
        int end = s.length();
        while (end > 1 && s.charAt(end - 1) == '0') end--;
        return new Digits(s.substring(0, end), point);
    }

    /**
     * The value of a JSON number with a fraction or an exponent as the Python parser reads it on its exact
     * path ({@code json_codec._exact_float}): a float when the float's shortest text has the number's value,
     * else the number's own digits ({@link PyDecimal}). Null for a number beyond a float (the caller's
     * {@code out_of_range}).
     */
    static Object exact(String text) {
        double v = Double.parseDouble(text);
        if (Double.isInfinite(v)) return null;
        if (text.length() > 16 || text.indexOf('e') >= 0 || text.indexOf('E') >= 0) {
            if (!sameValue(text, v)) return PyDecimal.of(text);
        }
        return v;
    }

    /** Whether the JSON number {@code text} has the value of {@code repr(v)} (Python's Decimal equality). */
    static boolean sameValue(String text, double v) {
        // The text as sign, significant digits and the place of the point: value = 0.DIGITS x 10^point.
        boolean negative = text.charAt(0) == '-';
        int i = negative ? 1 : 0, n = text.length();
        StringBuilder digits = new StringBuilder(n);
        int intDigits = 0;
        while (i < n && text.charAt(i) >= '0' && text.charAt(i) <= '9') { digits.append(text.charAt(i++)); intDigits++; }
        if (i < n && text.charAt(i) == '.') {
            i++;
            while (i < n && text.charAt(i) >= '0' && text.charAt(i) <= '9') digits.append(text.charAt(i++));
        }
        BigInteger exponent = BigInteger.ZERO;
        if (i < n && (text.charAt(i) == 'e' || text.charAt(i) == 'E')) {
            String e = text.substring(i + 1);
            exponent = new BigInteger(e.startsWith("+") ? e.substring(1) : e);
        }
        int lead = 0;
        while (lead < digits.length() && digits.charAt(lead) == '0') lead++;
        if (lead == digits.length()) return v == 0; // the text is a zero
        if (v == 0) return false;
        int end = digits.length();
        while (digits.charAt(end - 1) == '0') end--;
        String sig = digits.substring(lead, end);
        BigInteger point = exponent.add(BigInteger.valueOf(intDigits - lead));
        if (negative != (v < 0)) return false;
        Digits d = shortest(Math.abs(v));
        return d.digits.equals(sig) && point.equals(BigInteger.valueOf(d.point));
    }
}
