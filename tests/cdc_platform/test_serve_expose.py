"""`serve.expose: clean`: the catalog holds only the masked views; every other name of the lake is not found,
and a masked column never comes back in clear text (`views.catalog.register_catalog`, in the suite's session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_platform.errors import ConfigError
from cdc_platform.spark import spark_errors
from cdc_platform.views.catalog import register_catalog
from tests.cdc_platform.test_latest_state import ev

PEOPLE = [ev("c", pos=10 + i, table="people", after={"id": i, "name": n, "email": f"{n}@example.com"}) for i, n in enumerate(["ann", "bob", "cy"])]
UPDATE = [ev("u", pos=20, table="people", after={"id": 1, "name": "bobby", "email": "bobby@example.com"})]
#: Every name `expose: all` registers beside the masked views, as a query would name it.
HIDDEN = ["people", "people__full_view", "people__stored", "people_history", "people_history__stored", "raw_change_events",
          "dead_letter", "transactions", "consistency_watermark", "pipeline_metrics", "transaction_markers"]


@pytest.fixture
def masked_lake(lake_templates: Any, lake_at: Any, tmp_path: Path) -> Path:
    def build(root: Path) -> None:
        lake_at(root, {"shop.people": {"key": ["id"], "mask": ["email"], "history": True}}, PEOPLE + UPDATE)

    return lake_templates.copy("expose-people", build, tmp_path) / "lake"


def _drop_temp_views(spark: Any) -> None:
    """Other tests' session views would answer the names this test expects to be missing."""
    for temp in [t.name for t in spark.catalog.listTables() if t.isTemporary]:
        spark.catalog.dropTempView(temp)


@pytest.mark.parametrize("salt", [None, "pepper"])
def test_clean_registers_only_the_masked_views(masked_lake: Path, spark: Any, salt: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if salt is None:
        monkeypatch.delenv("CDC_MASK_SALT", raising=False)
    else:
        monkeypatch.setenv("CDC_MASK_SALT", salt)
    _drop_temp_views(spark)
    schema = f"clean_{'salted' if salt else 'nosalt'}"
    names = register_catalog(spark, masked_lake, schema, expose="clean")
    assert sorted(names) == ["people__clean_view", "people__consistent_view"]
    assert {r.tableName for r in spark.sql(f"SHOW TABLES IN {schema}").collect()} == set(names)
    rows = spark.sql(f"SELECT id, name, email FROM {schema}.people__clean_view ORDER BY id").collect()
    assert [(r.id, r.name) for r in rows] == [(0, "ann"), (1, "bobby"), (2, "cy")]  # the fold, inlined, still folds
    consistent = spark.sql(f"SELECT id, name, email FROM {schema}.people__consistent_view ORDER BY id").collect()
    assert consistent == rows
    for row in rows:
        assert row.email is None if salt is None else (len(row.email) == 64 and "@" not in row.email)
    spark.sql("USE default")  # nothing of the lake is reachable through the current schema either
    for name in HIDDEN:
        for reference in (f"{schema}.{name}", name):
            with pytest.raises(Exception) as caught:
                spark.sql(f"SELECT * FROM {reference}").collect()
            assert spark_errors.condition(caught.value) == "TABLE_OR_VIEW_NOT_FOUND", (reference, caught.value)


def test_clean_and_all_answer_alike(masked_lake: Path, spark: Any) -> None:
    """The inlined clean view is the `all` server's clean view, row for row."""
    _drop_temp_views(spark)
    register_catalog(spark, masked_lake, "alike_all")
    register_catalog(spark, masked_lake, "alike_clean", expose="clean")
    for view in ("people__clean_view", "people__consistent_view"):
        every = spark.sql(f"SELECT * FROM alike_all.{view} ORDER BY id").collect()
        assert every and every == spark.sql(f"SELECT * FROM alike_clean.{view} ORDER BY id").collect()


def test_an_unknown_expose_is_refused(masked_lake: Path, spark: Any) -> None:
    with pytest.raises(ConfigError, match="expose must be one of all, clean"):
        register_catalog(spark, masked_lake, "nope", expose="some")
