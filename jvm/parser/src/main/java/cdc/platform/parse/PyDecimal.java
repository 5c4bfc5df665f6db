package cdc.platform.parse;

import java.math.BigInteger;

/**
 * A JSON number that no 64-bit float holds, kept digit for digit as Python's {@code decimal.Decimal} of its
 * text, and written back as {@code str(Decimal)} (which simplejson writes for it). Never zero: a zero is
 * always a float. Only its text matters to the parser.
 */
final class PyDecimal {
    final String text; // str(Decimal(json_text))

    private PyDecimal(String text) {
        this.text = text;
    }

    @Override
    public String toString() {
        return text;
    }

    /** {@code Decimal(text)} for a JSON number text with a fraction or an exponent. */
    static PyDecimal of(String json) {
        boolean negative = json.charAt(0) == '-';
        int i = negative ? 1 : 0, n = json.length();
        StringBuilder coefficient = new StringBuilder(n);
        int fraction = 0;
        while (i < n && Character.isDigit(json.charAt(i)) && json.charAt(i) < 128) coefficient.append(json.charAt(i++));
        if (i < n && json.charAt(i) == '.') {
            i++;
            while (i < n && json.charAt(i) >= '0' && json.charAt(i) <= '9') { coefficient.append(json.charAt(i++)); fraction++; }
        }
        BigInteger exp = BigInteger.ZERO;
        if (i < n && (json.charAt(i) == 'e' || json.charAt(i) == 'E')) {
            String e = json.substring(i + 1);
            exp = new BigInteger(e.startsWith("+") ? e.substring(1) : e);
        }
        exp = exp.subtract(BigInteger.valueOf(fraction));
        int lead = 0;
        while (lead < coefficient.length() - 1 && coefficient.charAt(lead) == '0') lead++;
        String digits = coefficient.substring(lead);
        return new PyDecimal((negative ? "-" : "") + str(digits, exp));
    }

    /** Python's {@code Decimal.__str__} (scientific notation as the General Decimal Arithmetic spec says). */
    private static String str(String digits, BigInteger exp) {
        BigInteger left = exp.add(BigInteger.valueOf(digits.length())); // leftdigits
        BigInteger dot;
        if (exp.signum() <= 0 && left.compareTo(BigInteger.valueOf(-6)) > 0) dot = left;
        else dot = BigInteger.ONE;
        StringBuilder out = new StringBuilder(digits.length() + 24);
        int dotPlace = dot.intValueExact(); // within (-6, len(digits)] or 1
        if (dotPlace <= 0) {
            out.append("0.");
            for (int k = 0; k < -dotPlace; k++) out.append('0');
            out.append(digits);
        } else if (dotPlace >= digits.length()) {
            out.append(digits);
            for (int k = digits.length(); k < dotPlace; k++) out.append('0');
        } else {
            out.append(digits, 0, dotPlace).append('.').append(digits, dotPlace, digits.length());
        }
        if (!left.equals(dot)) {
            BigInteger e = left.subtract(dot);
            out.append('E').append(e.signum() < 0 ? "-" : "+").append(e.abs());
        }
        return out.toString();
    }
}
