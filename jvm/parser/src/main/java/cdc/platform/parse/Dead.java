package cdc.platform.parse;

/** A line (or value) the parser cannot normalise: a reason code of {@code envelope.REASONS}, its detail, the table. */
final class Dead extends Exception {
    final String code;
    final String detail;
    final String tableId;

    Dead(String code, String detail, String tableId) {
        super(code, null, false, false); // no stack trace: dead letters are data, and some batches hold many
        this.code = code;
        this.detail = detail;
        this.tableId = tableId;
    }

    Dead(String code, String detail) {
        this(code, detail, null);
    }

    Dead(String code) {
        this(code, "", null);
    }
}
