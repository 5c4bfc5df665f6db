package cdc.platform.lake;

import java.util.Locale;
import java.util.Map;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.DeltaOperations;
import org.apache.spark.sql.delta.DeltaOptions;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.OptimisticTransaction$;
import org.apache.spark.sql.delta.Snapshot;
import org.apache.spark.sql.delta.VersionChecksum;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.actions.SetTransaction;
import org.apache.spark.sql.delta.commands.DMLUtils;
import org.apache.spark.sql.delta.commands.WriteIntoDelta;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Delta's idempotent DataFrame write ({@code txnAppId}/{@code txnVersion}), with the "already committed?"
 * question answered from the table's version checksum instead of a state reconstruction.
 *
 * <p>Why: {@code WriteIntoDelta} asks {@code txn.txnVersion(appId)} before every such write, and in delta-spark
 * that reads {@code snapshot.transactions}, which computes the snapshot's whole state with a Spark job (a log
 * replay, cached) - about half a second a write here, several times a micro-batch, on tables that are only
 * appended to and never otherwise need that state. Since Delta 3 every commit also keeps its table's
 * application transactions in its {@code .crc} file, incrementally ({@code setTransactionsInCrc.writeOnCommit},
 * on by default, up to {@code setTransactionsInCrc.maxAllowed} of them), checked by Delta against the replayed
 * state wherever it validates checksums. This class reads that list from the transaction's snapshot (already in
 * memory: the checksum is loaded with the snapshot, or carried over from the previous commit) and then runs the
 * very steps {@code WriteIntoDelta.run} runs after its check: the same command's
 * {@code writeAndReturnCommitData} (schema merge, the files, the {@code SetTransaction} action) and
 * {@code commitIfNeeded} with the same operation, the application id noted as read, as {@code txnVersion} notes
 * it, so a concurrent commit of the same application still conflicts.
 *
 * <p>When the snapshot has no checksum or the checksum no application transactions (a table another writer
 * made, a commit whose checksum was never written, a table with a transaction retention set), it answers
 * {@link #UNKNOWN} and writes nothing: the caller then writes through Delta's own path, which checks the
 * replayed state. The answer is the same either way; only the cost differs.
 *
 * <p>A whole-table overwrite (the transaction stage's state and watermark, every batch) has the same kind of cost:
 * {@code WriteIntoDelta} lists the files it replaces with {@code txn.filterFiles()}, which reconstructs the
 * snapshot's state (a Spark job) and collects its files (a second one), ~0.4 s a write on a table of one or two
 * files. A small table's checksum lists those files too ({@code allFilesInCrc}, on by default up to
 * {@code allFilesInCrc.thresholdNumFiles} files, kept incrementally by every commit). When it does, the overwrite
 * writes its files as an append (the same command, schema checks and {@code SetTransaction}), removes the listed
 * files as {@code filterFiles().map(_.remove)} would, marks the whole table read ({@code readWholeTable} and the
 * files, as {@code filterFiles} marks them, so a concurrent commit conflicts the same way), and commits it as the
 * overwrite it is. Without such a list (a larger table, a checksum without one, options that overwrite less than
 * the whole table or its schema) it is {@code WriteIntoDelta}'s own overwrite. {@code spark.cdc.onceWrite.
 * overwriteFromChecksum=false} turns this off (to compare).
 */
public final class OnceWrite {
    /** The application already committed this version or a later one: nothing written. */
    public static final long ALREADY = -1L;
    /** The checksum could not tell: nothing written, write through Delta's own idempotent path instead. */
    public static final long UNKNOWN = -2L;
    /** The session setting that turns the overwrite from the checksum's file list off ({@code false}). */
    public static final String OVERWRITE_FROM_CHECKSUM = "spark.cdc.onceWrite.overwriteFromChecksum";

    private OnceWrite() {}

    /**
     * Write {@code data} to the Delta table at {@code path} in {@code mode} ("append" or "overwrite") with the
     * writer {@code options} a {@code df.write.format("delta")} would get; they must carry {@code txnAppId} and
     * {@code txnVersion}. The table must exist. Returns the table version the write committed, or {@link #ALREADY}
     * or {@link #UNKNOWN}.
     */
    public static long write(SparkSession spark, Dataset<Row> data, String path, String mode, Map<String, String> options) {
        String appId = options.get("txnAppId");
        String versionText = options.get("txnVersion");
        if (appId == null || versionText == null) {
            throw new IllegalArgumentException("OnceWrite needs the txnAppId and txnVersion options");
        }
        long version = Long.parseLong(versionText);
        SaveMode saveMode = saveMode(mode);
        DeltaLog log = DeltaLog.forTable(spark, path);
        OptimisticTransaction txn = log.startTransaction(Option.empty(), Option.empty());
        long recorded = recordedVersion(txn.snapshot(), appId);
        if (txn.readVersion() < 0 || recorded == Long.MIN_VALUE) {
            return UNKNOWN;
        }
        txn.readTxn().addOne(appId);  // what txn.txnVersion(appId) notes: a concurrent commit of this application conflicts
        if (recorded >= version) {
            return ALREADY;
        }
        scala.collection.immutable.Map<String, String> scalaOptions = scala.collection.immutable.Map.from(CollectionConverters.asScala(options));
        DeltaOptions deltaOptions = new DeltaOptions(scalaOptions, spark.sessionState().conf());
        Seq<String> noPartitionColumns = CollectionConverters.asScala(java.util.List.<String>of()).toSeq();
        scala.collection.immutable.Map<String, String> noConfiguration = scala.collection.immutable.Map.from(
                CollectionConverters.asScala(java.util.Map.<String, String>of()));
        Seq<AddFile> replaced = saveMode == SaveMode.Overwrite ? listedFiles(spark, log, txn.snapshot(), deltaOptions) : null;
        SaveMode written = replaced != null ? SaveMode.Append : saveMode;  // the files are removed below instead
        WriteIntoDelta command = new WriteIntoDelta(log, written, deltaOptions, noPartitionColumns, noConfiguration, data,
                Option.empty(), Option.empty(), false);
        OptimisticTransaction$.MODULE$.setActive(txn);
        try {
            DMLUtils.TaggedCommitData<Action> commitData = command.writeAndReturnCommitData(txn, spark, Option.empty(), false);
            Seq<Action> actions = commitData.actions();
            if (replaced != null) {
                txn.readWholeTable();
                txn.trackFilesRead(replaced);
                java.util.List<Action> all = new java.util.ArrayList<>(CollectionConverters.asJava(actions));
                long now = System.currentTimeMillis();
                for (AddFile file : CollectionConverters.asJava(replaced)) {
                    all.add(file.removeWithTimestamp(now, true));
                }
                actions = CollectionConverters.asScala(all).toSeq();
            }
            DeltaOperations.Write operation = new DeltaOperations.Write(
                    saveMode,
                    Option.apply(noPartitionColumns),
                    deltaOptions.replaceWhere(),
                    deltaOptions.userMetadata(),
                    dynamicOverwrite(deltaOptions) ? Option.apply((Object) Boolean.TRUE) : Option.empty(),
                    deltaOptions.canOverwriteSchema() ? Option.apply((Object) Boolean.TRUE) : Option.empty(),
                    deltaOptions.canMergeSchema() ? Option.apply((Object) Boolean.TRUE) : Option.empty(),
                    deltaOptions.replaceOn(),
                    deltaOptions.replaceUsing());
            // Never skipped: the actions hold the SetTransaction at least.
            return (Long) txn.commitIfNeeded(actions, operation, commitData.stringTags()).get();
        } finally {
            OptimisticTransaction$.MODULE$.clearActive();
        }
    }

    /**
     * The version {@code appId} last committed, from the snapshot's checksum: -1 if the checksum lists the
     * table's application transactions and this one is not among them, {@code Long.MIN_VALUE} if it does not
     * list them.
     */
    static long recordedVersion(Snapshot snapshot, String appId) {
        Option<VersionChecksum> checksum = snapshot.checksumOpt();
        if (checksum.isEmpty()) {
            return Long.MIN_VALUE;
        }
        Option<scala.collection.immutable.Seq<SetTransaction>> known = checksum.get().setTransactions();
        if (known.isEmpty()) {
            return Long.MIN_VALUE;
        }
        long recorded = -1L;
        for (SetTransaction t : CollectionConverters.asJava(known.get())) {
            if (appId.equals(t.appId())) {
                recorded = Math.max(recorded, t.version());
            }
        }
        return recorded;
    }

    /**
     * The files a whole-table overwrite of {@code snapshot} replaces, from its checksum's file list; null when the
     * checksum has no list, the session turned this off, or the options overwrite less than the whole table or
     * change its schema (then {@code WriteIntoDelta} decides what it removes).
     */
    static Seq<AddFile> listedFiles(SparkSession spark, DeltaLog log, Snapshot snapshot, DeltaOptions options) {
        if ("false".equalsIgnoreCase(spark.conf().get(OVERWRITE_FROM_CHECKSUM, "true"))) {
            return null;
        }
        if (options.replaceWhere().isDefined() || options.isReplaceOnOrUsingDefined() || options.canOverwriteSchema()
                || options.canMergeSchema() || dynamicOverwrite(options)) {
            return null;
        }
        return ChecksumRead.listedFiles(log, snapshot, Long.MAX_VALUE);  // any size; deletion vectors: Delta's way
    }

    private static SaveMode saveMode(String mode) {
        switch (mode.toLowerCase(Locale.ROOT)) {
            case "append":
                return SaveMode.Append;
            case "overwrite":
                return SaveMode.Overwrite;
            default:
                throw new IllegalArgumentException("OnceWrite writes in append or overwrite mode, not " + mode);
        }
    }

    private static boolean dynamicOverwrite(DeltaOptions options) {
        try {
            return options.isDynamicPartitionOverwriteMode();
        } catch (RuntimeException e) {  // WriteIntoDelta reads it the same way: Try(...).getOrElse(false)
            return false;
        }
    }
}
