package cdc.platform.lake;

import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.Snapshot;
import org.apache.spark.sql.delta.VersionChecksum;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.actions.InMemoryLogReplay;

import scala.Option;
import scala.Tuple2;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The files of one version of a small Delta table, from the list its version checksum keeps, instead of from the
 * snapshot's replayed state: what {@link ChecksumScan} plans a query's scan of such a table with.
 *
 * <p>Why: Delta plans a scan with {@code filesForScan}, which reconstructs the snapshot's state (reads the log's
 * checkpoint and commits with a Spark job) the first time a version is scanned in this process, and then runs a
 * file-skipping job over that state for every scan. Every commit makes a new version, so a reader that pins the
 * lake's tables (every {@code cdc sql}, check and view registration) paid one reconstruction per table it reads: in
 * {@code cdc demo}'s counting, five of them one after another took 5.9 s of its 9.6 s, on tables of a few
 * kilobytes; and a lookup through a full view paid five file-skipping jobs. Since Delta 3 every commit's checksum
 * also lists a small table's files ({@code allFilesInCrc}, on by default up to
 * {@code allFilesInCrc.thresholdNumFiles} files, kept incrementally by each commit and checked by Delta against the
 * replayed state where it validates checksums), and the snapshot carries that checksum in memory.
 *
 * <p>What a read from the list gives up is Delta's statistics-based file skipping (partition pruning stays, and
 * Parquet's own row-group statistics still apply), so it is only used for a table whose whole size is at most
 * {@value #DEFAULT_MAX_BYTES} bytes ({@link #MAX_BYTES}): reading every file of a table that small costs less than
 * the reconstruction or the job. A table without such a list (more files, a checksum without one), over the size,
 * with deletion vectors, or with the setting {@link #ENABLED} off gets {@code null}: Delta's own path. The rows are
 * the same either way; only the cost differs.
 */
public final class ChecksumRead {
    /** The session setting that turns these reads off ({@code false}), to compare. */
    public static final String ENABLED = "spark.cdc.read.fromChecksum";
    /** The session setting for the largest table (bytes of data files) read from its checksum's list. */
    public static final String MAX_BYTES = "spark.cdc.read.fromChecksum.maxBytes";
    /** 16 MiB: a few hundred thousand narrow rows. */
    public static final long DEFAULT_MAX_BYTES = 16L << 20;

    private ChecksumRead() {}

    /**
     * The files of the snapshot's version from its checksum's list, or {@code null} when its checksum has no usable
     * list, more than {@code maxBytes} of data, or a file with a deletion vector.
     *
     * <p>A commit that changes the table's schema (a latest-state table's first batch adds the source's columns)
     * gets a checksum without a list: Delta does not carry the list across a schema change. When the previous
     * version's checksum has one, the list is that one with this commit's adds and removes replayed on it, by
     * Delta's own {@code InMemoryLogReplay} (one small JSON file read, no Spark job), as Delta's incremental
     * checksum computes it. Any list is used only when its count and bytes are this checksum's own.
     */
    static Seq<AddFile> listedFiles(DeltaLog log, Snapshot snapshot, long maxBytes) {
        Option<VersionChecksum> checksum = snapshot.checksumOpt();
        if (checksum.isEmpty() || checksum.get().tableSizeBytes() > maxBytes) {
            return null;
        }
        VersionChecksum crc = checksum.get();
        Seq<AddFile> files = crc.allFiles().isDefined() ? crc.allFiles().get() : replayed(log, snapshot.version());
        if (files == null || files.size() != crc.numFiles()) {
            return null;  // a list that disagrees with its checksum's count is not used
        }
        long bytes = 0;
        for (AddFile file : CollectionConverters.asJava(files)) {
            if (file.deletionVector() != null) {
                return null;
            }
            bytes += file.size();
        }
        return bytes == crc.tableSizeBytes() ? files : null;
    }

    /** The previous version's listed files with commit {@code version}'s actions replayed on them, or {@code null}. */
    static Seq<AddFile> replayed(DeltaLog log, long version) {
        if (version < 1) {
            return null;
        }
        Option<VersionChecksum> previous = log.readChecksum(version - 1, Option.empty());
        if (previous.isEmpty() || previous.get().allFiles().isEmpty()) {
            return null;
        }
        scala.collection.Iterator<Tuple2<Object, Seq<Action>>> changes = log.getChanges(version, Option.empty(), false);
        if (!changes.hasNext()) {
            return null;
        }
        Tuple2<Object, Seq<Action>> commit = changes.next();
        if ((Long) commit._1() != version) {
            return null;
        }
        InMemoryLogReplay replay = new InMemoryLogReplay(Option.empty(), Option.empty());
        replay.append(version - 1, previous.get().allFiles().get().iterator().map(file -> (Action) file));
        replay.append(version, commit._2().iterator());
        return replay.allFiles();
    }
}
