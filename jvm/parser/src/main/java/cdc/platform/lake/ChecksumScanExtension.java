package cdc.platform.lake;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;

import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Installs {@link ChecksumScan} in a session's optimizer, named in {@code spark.sql.extensions} beside Delta's own
 * extension (cdc_platform/spark/session.py). Its rules run in the operator optimisation, before Delta's
 * {@code PrepareDeltaScan} (a pre-CBO rule), which then leaves the listed scans alone. A session whose class path
 * lacks this jar logs Spark's warning and reads through Delta's path only.
 */
public final class ChecksumScanExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectOptimizerRule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new ChecksumScan(session);
            }
        });
        return BoxedUnit.UNIT;
    }
}
