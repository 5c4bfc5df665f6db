package cdc.platform.parse;

import java.util.List;
import java.util.Map;

/**
 * One line's row of the PARSED schema (cdc_platform/lake/schemas.py), as {@code envelope.parse_line} returns
 * it; a field it leaves out is null. Times are epoch microseconds and dates days since 1970-01-01 (Spark
 * turns them into its types). {@code line} is set only when it differs from the input value: a line that is
 * not UTF-8, kept with its bad bytes as {@code \xNN}, and the empty text of a null value.
 */
public final class ParsedRow {
    public String kind;
    public String eventId;
    public String tableId;
    public String sourceConnector;
    public String sourceName;
    public String sourceDb;
    public String sourceSchema;
    public String sourceTable;
    public String op;
    public String key;
    public String before;
    public String after;
    public String rowSchema;
    public String position;
    public String positionKind;
    public Long sourceTs;
    public Long envelopeTs;
    public Boolean snapshot;
    public String transactionId;
    public String transactionRawId;
    public Long txTotalOrder;
    public Long txCollectionOrder;
    public Integer eventDate;
    public String markerId;
    public Integer markerDate;
    public String status;
    public Long eventCount;
    /** A marker's per-table counts, in order; a name may repeat (a list of pairs, as the Python parser keeps them). */
    public List<Map.Entry<String, Long>> dataCollections;
    public String markerShape;
    public Long markerTs;
    public String reasonCode;
    public String reason;
    public String line;

    ParsedRow(String kind) {
        this.kind = kind;
    }
}
