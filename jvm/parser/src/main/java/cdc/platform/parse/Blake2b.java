package cdc.platform.parse;

/**
 * BLAKE2b (RFC 7693) without a key, for the event identity: Python's {@code hashlib.blake2b(data,
 * digest_size=16).hexdigest()}. Spark's classpath has no BLAKE2 (commons-codec has BLAKE3 only), and the
 * identity must stay the same hash of the same text, so an existing lake needs no upgrade. The rounds are
 * written out (message schedule inlined) so the state stays in registers within each: every change event hashes its
 * envelope, a few hundred bytes.
 */
final class Blake2b {
    private Blake2b() {}

    private static final long IV0 = 0x6a09e667f3bcc908L, IV1 = 0xbb67ae8584caa73bL, IV2 = 0x3c6ef372fe94f82bL, IV3 = 0xa54ff53a5f1d36f1L,
        IV4 = 0x510e527fade682d1L, IV5 = 0x9b05688c2b3e6c1fL, IV6 = 0x1f83d9abfb41bd6bL, IV7 = 0x5be0cd19137e2179L;

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** The lowercase hex of the 16-byte BLAKE2b digest of {@code data}. */
    static String hex128(byte[] data) {
        long[] h = {IV0 ^ 0x01010010L, IV1, IV2, IV3, IV4, IV5, IV6, IV7}; // parameter block: 16-byte digest, no key, fanout 1, depth 1
        long[] m = new long[16];
        int n = data.length, offset = 0;
        long counter = 0;
        // every full block but the last is compressed as it comes; the last (possibly partial, possibly empty) is final
        while (n - offset > 128) {
            load(m, data, offset, 128);
            counter += 128;
            compress(h, m, counter, false);
            offset += 128;
        }
        load(m, data, offset, n - offset);
        counter += n - offset;
        compress(h, m, counter, true);
        char[] out = new char[32];
        for (int i = 0; i < 16; i++) {
            int b = (int) (h[i >> 3] >>> (8 * (i & 7))) & 0xff;
            out[2 * i] = HEX[b >> 4];
            out[2 * i + 1] = HEX[b & 15];
        }
        return new String(out);
    }

    private static void load(long[] m, byte[] data, int offset, int len) {
        int full = len >> 3;
        for (int w = 0; w < full; w++) {
            int p = offset + 8 * w;
            m[w] = (data[p] & 0xffL) | (data[p + 1] & 0xffL) << 8 | (data[p + 2] & 0xffL) << 16 | (data[p + 3] & 0xffL) << 24
                | (data[p + 4] & 0xffL) << 32 | (data[p + 5] & 0xffL) << 40 | (data[p + 6] & 0xffL) << 48 | (data[p + 7] & 0xffL) << 56;
        }
        for (int w = full; w < 16; w++) m[w] = 0;
        for (int i = full * 8; i < len; i++) m[i >> 3] |= (data[offset + i] & 0xffL) << (8 * (i & 7));
    }

    private static void compress(long[] h, long[] m, long counter, boolean last) {
        long[] v = {h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], IV0, IV1, IV2, IV3, IV4 ^ counter, IV5, last ? ~IV6 : IV6, IV7};
        // (the counter's high 64 bits stay 0: a line is far below 2^64 bytes)
        round0(v, m); round1(v, m); round2(v, m); round3(v, m); round4(v, m); round5(v, m);
        round6(v, m); round7(v, m); round8(v, m); round9(v, m); round0(v, m); round1(v, m);
        for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
    }

    // One round each, the message schedule (RFC 7693's SIGMA) written in: rounds 10 and 11 repeat 0 and 1.
    private static void round0(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[0]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[1]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[2]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[3]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[4]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[5]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[6]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[7]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[8]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[9]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[10]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[11]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[12]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[13]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[14]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[15]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round1(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[14]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[10]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[4]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[8]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[9]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[15]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[13]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[6]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[1]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[12]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[0]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[2]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[11]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[7]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[5]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[3]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round2(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[11]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[8]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[12]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[0]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[5]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[2]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[15]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[13]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[10]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[14]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[3]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[6]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[7]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[1]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[9]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[4]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round3(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[7]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[9]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[3]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[1]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[13]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[12]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[11]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[14]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[2]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[6]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[5]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[10]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[4]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[0]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[15]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[8]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round4(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[9]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[0]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[5]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[7]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[2]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[4]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[10]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[15]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[14]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[1]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[11]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[12]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[6]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[8]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[3]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[13]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round5(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[2]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[12]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[6]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[10]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[0]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[11]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[8]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[3]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[4]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[13]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[7]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[5]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[15]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[14]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[1]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[9]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round6(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[12]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[5]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[1]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[15]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[14]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[13]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[4]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[10]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[0]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[7]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[6]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[3]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[9]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[2]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[8]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[11]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round7(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[13]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[11]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[7]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[14]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[12]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[1]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[3]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[9]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[5]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[0]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[15]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[4]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[8]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[6]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[2]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[10]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round8(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[6]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[15]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[14]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[9]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[11]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[3]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[0]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[8]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[12]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[2]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[13]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[7]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[1]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[4]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[10]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[5]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }

    private static void round9(long[] v, long[] m) {
        long v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3], v4 = v[4], v5 = v[5], v6 = v[6], v7 = v[7];
        long v8 = v[8], v9 = v[9], v10 = v[10], v11 = v[11], v12 = v[12], v13 = v[13], v14 = v[14], v15 = v[15];
        v0 += v4 + m[10]; v12 = Long.rotateRight(v12 ^ v0, 32); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 24);
        v0 += v4 + m[2]; v12 = Long.rotateRight(v12 ^ v0, 16); v8 += v12; v4 = Long.rotateRight(v4 ^ v8, 63);
        v1 += v5 + m[8]; v13 = Long.rotateRight(v13 ^ v1, 32); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 24);
        v1 += v5 + m[4]; v13 = Long.rotateRight(v13 ^ v1, 16); v9 += v13; v5 = Long.rotateRight(v5 ^ v9, 63);
        v2 += v6 + m[7]; v14 = Long.rotateRight(v14 ^ v2, 32); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 24);
        v2 += v6 + m[6]; v14 = Long.rotateRight(v14 ^ v2, 16); v10 += v14; v6 = Long.rotateRight(v6 ^ v10, 63);
        v3 += v7 + m[1]; v15 = Long.rotateRight(v15 ^ v3, 32); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 24);
        v3 += v7 + m[5]; v15 = Long.rotateRight(v15 ^ v3, 16); v11 += v15; v7 = Long.rotateRight(v7 ^ v11, 63);
        v0 += v5 + m[15]; v15 = Long.rotateRight(v15 ^ v0, 32); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 24);
        v0 += v5 + m[11]; v15 = Long.rotateRight(v15 ^ v0, 16); v10 += v15; v5 = Long.rotateRight(v5 ^ v10, 63);
        v1 += v6 + m[9]; v12 = Long.rotateRight(v12 ^ v1, 32); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 24);
        v1 += v6 + m[14]; v12 = Long.rotateRight(v12 ^ v1, 16); v11 += v12; v6 = Long.rotateRight(v6 ^ v11, 63);
        v2 += v7 + m[3]; v13 = Long.rotateRight(v13 ^ v2, 32); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 24);
        v2 += v7 + m[12]; v13 = Long.rotateRight(v13 ^ v2, 16); v8 += v13; v7 = Long.rotateRight(v7 ^ v8, 63);
        v3 += v4 + m[13]; v14 = Long.rotateRight(v14 ^ v3, 32); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 24);
        v3 += v4 + m[0]; v14 = Long.rotateRight(v14 ^ v3, 16); v9 += v14; v4 = Long.rotateRight(v4 ^ v9, 63);
        v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3; v[4] = v4; v[5] = v5; v[6] = v6; v[7] = v7;
        v[8] = v8; v[9] = v9; v[10] = v10; v[11] = v11; v[12] = v12; v[13] = v13; v[14] = v14; v[15] = v15;
    }
}
