package cdc.platform.parse;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * UTF-8 as Python's codec reads it: what is well formed (no surrogates, no overlong forms, nothing past
 * U+10FFFF), where the first bad byte is, and the two lossy decodings the Python parser uses
 * ({@code backslashreplace} for a dead letter's line, {@code replace} for a Kafka key).
 */
final class Utf8 {
    private Utf8() {}

    /** The length of the well-formed sequence that starts at {@code i}, or 0 when none does. */
    static int sequenceLength(byte[] b, int i, int end) {
        int b0 = b[i] & 0xff;
        if (b0 < 0x80) return 1;
        if (b0 < 0xc2 || b0 > 0xf4) return 0;
        int n = b0 < 0xe0 ? 2 : b0 < 0xf0 ? 3 : 4;
        return maximalPrefix(b, i, end) == n ? n : 0;
    }

    /**
     * How many bytes from {@code i} form the longest prefix of a well-formed sequence (the Unicode
     * standard's "maximal subpart"): at least 1; equal to the sequence's length when it is complete.
     */
    static int maximalPrefix(byte[] b, int i, int end) {
        int b0 = b[i] & 0xff;
        if (b0 < 0x80) return 1;
        if (b0 < 0xc2 || b0 > 0xf4) return 1;
        int n = b0 < 0xe0 ? 2 : b0 < 0xf0 ? 3 : 4;
        int k = 1;
        while (k < n && i + k < end) {
            int c = b[i + k] & 0xff;
            int lo = 0x80, hi = 0xbf;
            if (k == 1) {
                if (b0 == 0xe0) lo = 0xa0;
                else if (b0 == 0xed) hi = 0x9f;
                else if (b0 == 0xf0) lo = 0x90;
                else if (b0 == 0xf4) hi = 0x8f;
            }
            if (c < lo || c > hi) break;
            k++;
        }
        return k;
    }

    private static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long HIGH_BITS = 0x8080808080808080L;

    /** The offset of the first byte that is not ASCII from {@code from} on (eight bytes at a time), or {@code end}. */
    static int firstNonAscii(byte[] b, int from, int end) {
        int i = from;
        for (; i + 8 <= end; i += 8) {
            if (((long) LONGS.get(b, i) & HIGH_BITS) != 0) break;
        }
        for (; i < end; i++) if (b[i] < 0) return i;
        return end;
    }

    /** The offset of the first byte that starts no well-formed sequence, or -1 when all of {@code b} is UTF-8. */
    static int firstInvalid(byte[] b) {
        int end = b.length;
        int i = firstNonAscii(b, 0, end);
        while (i < end) {
            if (b[i] >= 0) { i++; continue; }
            int n = sequenceLength(b, i, end);
            if (n == 0) return i;
            i += n;
        }
        return -1;
    }

    /** True when every byte is ASCII. */
    static boolean isAscii(byte[] b, int from, int to) {
        return firstNonAscii(b, from, to) == to;
    }

    /** The number of code points in the well-formed bytes {@code [from, to)}. */
    static int codePoints(byte[] b, int from, int to) {
        int n = 0;
        for (int i = from; i < to; i++) if ((b[i] & 0xc0) != 0x80) n++;
        return n;
    }

    /** The byte offset {@code count} code points after {@code from} (well-formed input), or -1 past {@code end}. */
    static int advance(byte[] b, int from, int end, int count) {
        int i = from;
        for (int k = 0; k < count; k++) {
            if (i >= end) return -1;
            int b0 = b[i] & 0xff;
            i += b0 < 0x80 ? 1 : b0 < 0xe0 ? 2 : b0 < 0xf0 ? 3 : 4;
        }
        return i <= end ? i : -1;
    }

    static String decode(byte[] b, int from, int to) {
        return new String(b, from, to - from, StandardCharsets.UTF_8);
    }

    /** Python's {@code bytes.decode("utf-8", "backslashreplace")}: each byte of a bad sequence as {@code \xNN}. */
    static String backslashReplace(byte[] b) {
        StringBuilder out = new StringBuilder(b.length + 16);
        int i = 0, end = b.length, run = 0;
        while (i < end) {
            int n = b[i] >= 0 ? 1 : sequenceLength(b, i, end);
            if (n > 0) { i += n; continue; }
            out.append(decode(b, run, i));
            int bad = maximalPrefix(b, i, end);
            for (int k = 0; k < bad; k++) {
                int v = b[i + k] & 0xff;
                out.append("\\x").append(Character.forDigit(v >> 4, 16)).append(Character.forDigit(v & 15, 16));
            }
            i += bad;
            run = i;
        }
        return out.append(decode(b, run, end)).toString();
    }

    /** Python's {@code bytes.decode("utf-8", "replace")}: one U+FFFD for each maximal bad subpart. */
    static String replace(byte[] b) {
        StringBuilder out = new StringBuilder(b.length);
        int i = 0, end = b.length, run = 0;
        while (i < end) {
            int n = b[i] >= 0 ? 1 : sequenceLength(b, i, end);
            if (n > 0) { i += n; continue; }
            out.append(decode(b, run, i)).append('\ufffd');
            i += maximalPrefix(b, i, end);
            run = i;
        }
        return out.append(decode(b, run, end)).toString();
    }
}
