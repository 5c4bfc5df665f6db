"""`spark_errors` on the text a `cdc serve` answers with over JDBC: the error class and its parameters are
recovered, so `cdc sql` through the server says the same one line as a local session (no Spark needed)."""

from __future__ import annotations

import pytest

from cdc_platform.spark.spark_errors import ServerSideError, condition, describe, is_spark_error, jvm_stack

HS2 = "org.apache.hive.service.cli.HiveSQLException: Error running query: "
STACK = "\n\tat org.apache.spark.sql.hive.thriftserver.HiveThriftServerErrors$.runningQueryError(HiveThriftServerErrors.scala:43)"


@pytest.mark.parametrize("text, cls, expected", [
    (HS2 + "[PARSE_SYNTAX_ERROR] org.apache.spark.sql.catalyst.parser.ParseException: \n[PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'. "
     "SQLSTATE: 42601 (line 1, pos 0)\n\n== SQL ==\nSELEC 1\n^^^\n" + STACK,
     "PARSE_SYNTAX_ERROR", "syntax error in the query at or near 'SELEC' (line 1, position 1): fix the SQL"),
    (HS2 + "[UNRESOLVED_COLUMN.WITH_SUGGESTION] org.apache.spark.sql.AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, "
     "or function parameter with name `nosuch` cannot be resolved. Did you mean one of the following? [`id`, `name`]. SQLSTATE: 42703; line 1 pos 7;\n'Project",
     "UNRESOLVED_COLUMN.WITH_SUGGESTION",
     "unknown column `nosuch`; the columns nearest by name are `id`, `name` (`DESCRIBE name_of_table` lists a table's columns)"),
    (HS2 + "[TABLE_OR_VIEW_NOT_FOUND] org.apache.spark.sql.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] The table or view `peple__full_view` "
     "cannot be found. Verify the spelling and correctness of the schema and catalog.\nIf you did not qualify the name ...",
     "TABLE_OR_VIEW_NOT_FOUND",
     "unknown table or view `peple__full_view`: did you mean `people__full_view`, `people__clean_view`? the lake has 2 tables and views; `SHOW TABLES` lists them"),
    (HS2 + "[UNRESOLVED_ROUTINE] org.apache.spark.sql.AnalysisException: [UNRESOLVED_ROUTINE] Cannot resolve routine `nofn` on search path "
     "[`system`.`builtin`, `system`.`session`, `spark_catalog`.`cdc`]. SQLSTATE: 42883; line 1 pos 7",
     "UNRESOLVED_ROUTINE", "unknown function `nofn`: `SHOW FUNCTIONS` lists Spark SQL's functions"),
    (HS2 + "[DIVIDE_BY_ZERO] org.apache.spark.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor "
     "being 0 and return NULL instead. SQLSTATE: 22012\n== SQL (line 1, position 8) ==\nSELECT 1/0" + STACK,
     "DIVIDE_BY_ZERO", "Division by zero. Use `try_divide` to tolerate divisor being 0 and return NULL instead. (Spark DIVIDE_BY_ZERO)"),
])
def test_a_server_error_reads_like_a_local_one(text: str, cls: str, expected: str) -> None:
    exc = ServerSideError(text)
    assert is_spark_error(exc) and condition(exc) == cls
    assert describe(exc, ["people__full_view", "people__clean_view"]) == expected
    assert jvm_stack(exc) == text  # --verbose shows the server's whole answer


def test_a_server_error_without_spark_class_keeps_its_first_line() -> None:
    exc = ServerSideError("org.apache.hive.service.cli.HiveSQLException: Invalid SessionHandle: SessionHandle [x]\n\tat org.apache...")
    assert condition(exc) is None
    assert describe(exc) == "Spark failed: org.apache.hive.service.cli.HiveSQLException: Invalid SessionHandle: SessionHandle [x]"
