package cdc.platform.parse;

/**
 * BLAKE2b (RFC 7693) without a key, for the event identity: Python's {@code hashlib.blake2b(data,
 * digest_size=16).hexdigest()}. Spark's classpath has no BLAKE2 (commons-codec has BLAKE3 only), and the
 * identity must stay the same hash of the same text, so an existing lake needs no upgrade.
 */
final class Blake2b {
    private Blake2b() {}

    private static final long[] IV = {
        0x6a09e667f3bcc908L, 0xbb67ae8584caa73bL, 0x3c6ef372fe94f82bL, 0xa54ff53a5f1d36f1L,
        0x510e527fade682d1L, 0x9b05688c2b3e6c1fL, 0x1f83d9abfb41bd6bL, 0x5be0cd19137e2179L,
    };

    private static final byte[][] SIGMA = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
        {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
        {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
        {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
        {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    };

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** The lowercase hex of the 16-byte BLAKE2b digest of {@code data}. */
    static String hex128(byte[] data) {
        long[] h = IV.clone();
        h[0] ^= 0x01010000L ^ 16; // parameter block: digest length 16, no key, fanout 1, depth 1
        long[] m = new long[16];
        long[] v = new long[16];
        int n = data.length;
        int offset = 0;
        long counter = 0;
        // every full block but the last is compressed as it comes; the last (possibly partial, possibly empty) is final
        while (n - offset > 128) {
            load(m, data, offset, 128);
            counter += 128;
            compress(h, m, v, counter, false);
            offset += 128;
        }
        load(m, data, offset, n - offset);
        counter += n - offset;
        compress(h, m, v, counter, true);
        char[] out = new char[32];
        for (int i = 0; i < 16; i++) {
            int b = (int) (h[i >> 3] >>> (8 * (i & 7))) & 0xff;
            out[2 * i] = HEX[b >> 4];
            out[2 * i + 1] = HEX[b & 15];
        }
        return new String(out);
    }

    private static void load(long[] m, byte[] data, int offset, int len) {
        java.util.Arrays.fill(m, 0);
        for (int i = 0; i < len; i++) m[i >> 3] |= (data[offset + i] & 0xffL) << (8 * (i & 7));
    }

    private static void compress(long[] h, long[] m, long[] v, long counter, boolean last) {
        System.arraycopy(h, 0, v, 0, 8);
        System.arraycopy(IV, 0, v, 8, 8);
        v[12] ^= counter; // the high 64 bits of the counter stay 0: lines are far below 2^64 bytes
        if (last) v[14] = ~v[14];
        for (int r = 0; r < 12; r++) {
            byte[] s = SIGMA[r % 10];
            g(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
            g(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
            g(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
            g(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
            g(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
            g(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
            g(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
            g(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
        }
        for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
    }

    private static void g(long[] v, int a, int b, int c, int d, long x, long y) {
        v[a] = v[a] + v[b] + x;
        v[d] = Long.rotateRight(v[d] ^ v[a], 32);
        v[c] = v[c] + v[d];
        v[b] = Long.rotateRight(v[b] ^ v[c], 24);
        v[a] = v[a] + v[b] + y;
        v[d] = Long.rotateRight(v[d] ^ v[a], 16);
        v[c] = v[c] + v[d];
        v[b] = Long.rotateRight(v[b] ^ v[c], 63);
    }
}
