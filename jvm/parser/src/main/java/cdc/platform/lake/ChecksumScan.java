package cdc.platform.lake;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Subquery;
import org.apache.spark.sql.catalyst.plans.logical.SupportsSubquery;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.DeltaTableUtils;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.Snapshot;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.files.TahoeBatchFileIndex;
import org.apache.spark.sql.delta.files.TahoeLogFileIndex;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;

import scala.collection.immutable.Seq;
import scala.runtime.AbstractPartialFunction;

/**
 * An optimizer rule: a query's scan of a small Delta table lists its files from the version's checksum
 * ({@link ChecksumRead#listedFiles}) instead of with Delta's file-skipping job.
 *
 * <p>Why: Delta plans every scan of a table read at its latest version ({@code PrepareDeltaScan}, after this
 * rule) with {@code filesForScan}, a Spark job over the snapshot's cached state, one per scan whose filters
 * differ. A lookup through a {@code __full_view} scans five tables (the stored state twice, the raw log's tail
 * twice, the dead letters), and those five jobs were 1.5 s of its ~1.9 s of optimisation (benchmarks/README.md,
 * "A twentieth session"). For a table of at most {@code spark.cdc.read.fromChecksum.maxBytes} the checksum
 * already lists every file, and Delta's own {@link TahoeBatchFileIndex} serves a known list (partition pruning in
 * the driver, no job; Parquet's row-group statistics still skip); a bigger table, one whose checksum has no list,
 * one with deletion vectors, and every scan inside an active Delta transaction (whose reads Delta records for its
 * conflict checks) keep Delta's own path. {@code spark.cdc.read.fromChecksum=false} turns the rule off.
 *
 * <p>Which version: the one Delta would scan, {@code TahoeLogFileIndex.getSnapshot} (the table's latest, with
 * Delta's check that its schema still reads as analysed; a time-travel read's pinned one), taken once per table
 * for the whole query, subqueries included, as Delta pins a table's first-access snapshot for a query. Spark
 * builds its optimizer's rules for each query it optimises, so that pin never outlives the query. The rule runs once
 * per query, just before {@code PrepareDeltaScan} in the same pre-CBO batch ({@link ChecksumScanExtension}).
 */
public final class ChecksumScan extends Rule<LogicalPlan> {
    private final SparkSession spark;
    /** Per table (and pinned version), the files this query reads, or none (Delta's own path). */
    private final Map<String, Listing> pinned = new HashMap<>();

    private record Listing(Snapshot snapshot, Seq<AddFile> files) {}

    public ChecksumScan(SparkSession spark) {
        this.spark = spark;
    }

    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        // A subquery is optimised on its own first; its scans are replaced with the whole query's, as Delta does.
        if (plan instanceof Subquery || plan instanceof SupportsSubquery) {
            return plan;
        }
        if ("false".equalsIgnoreCase(spark.conf().get(ChecksumRead.ENABLED, "true"))
                || OptimisticTransaction.getActive().isDefined()) {
            return plan;
        }
        long maxBytes = maxBytes(spark.conf().get(ChecksumRead.MAX_BYTES, Long.toString(ChecksumRead.DEFAULT_MAX_BYTES)));
        return plan.transformUpWithSubqueries(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan node) {
                return index(node) != null;
            }

            @Override
            public LogicalPlan apply(LogicalPlan node) {
                TahoeLogFileIndex index = index(node);
                if (index == null) {
                    return node;
                }
                Listing listing = listing(index, maxBytes);
                if (listing == null) {
                    return node;
                }
                DeltaLog log = index.deltaLog();
                TahoeBatchFileIndex listed = new TahoeBatchFileIndex(
                        spark, "batch", listing.files(), log, log.dataPath(), listing.snapshot(), false);
                return DeltaTableUtils.replaceFileIndex(node, listed);
            }
        });
    }

    /** The size limit's setting as a number of bytes; anything else fails the query with what to set instead. */
    static long maxBytes(String setting) {
        try {
            return Long.parseLong(setting.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(ChecksumRead.MAX_BYTES + " must be a whole number of bytes (default "
                    + ChecksumRead.DEFAULT_MAX_BYTES + "), not '" + setting + "': set it to one, or unset it");
        }
    }

    /** The Delta file index a batch scan of {@code node} plans with Delta's job, or {@code null}. */
    private static TahoeLogFileIndex index(LogicalPlan node) {
        if (node instanceof LogicalRelation relation && !relation.isStreaming()
                && relation.relation() instanceof HadoopFsRelation files
                && files.location() instanceof TahoeLogFileIndex index
                && index.partitionFilters().isEmpty()) {
            return index;
        }
        return null;
    }

    private Listing listing(TahoeLogFileIndex index, long maxBytes) {
        String key = index.deltaLog().compositeId().toString() + (index.isTimeTravelQuery() ? "@" + index.versionToUse() : "");
        if (pinned.containsKey(key)) {
            return pinned.get(key);
        }
        Snapshot snapshot = index.getSnapshot();
        Seq<AddFile> files = ChecksumRead.listedFiles(index.deltaLog(), snapshot, maxBytes);
        Listing listing = files == null ? null : new Listing(snapshot, files);
        pinned.put(key, listing);
        return listing;
    }
}
