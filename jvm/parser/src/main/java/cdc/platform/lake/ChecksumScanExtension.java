package cdc.platform.lake;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;

import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Installs {@link ChecksumScan} in a session's optimizer, named in {@code spark.sql.extensions} ahead of Delta's own
 * extension (cdc_platform/spark/session.py). It is a pre-CBO rule, as Delta's {@code PrepareDeltaScan} is: that batch
 * runs once per query, after the filters are pushed down, and its rules in the order their extensions are listed, so
 * this one runs just before Delta's, which then leaves the listed scans alone. (In the operator optimisation it
 * would walk the plan on every round of that fixed-point batch.) A session whose class path lacks this jar logs
 * Spark's warning and reads through Delta's path only.
 */
public final class ChecksumScanExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectPreCBORule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new ChecksumScan(session);
            }
        });
        return BoxedUnit.UNIT;
    }
}
