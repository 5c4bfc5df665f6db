"""Config loading: one typed object, relative paths, overrides, and rejections that name the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_platform.config import load_config
from cdc_platform.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf" / "cdc.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_loads_tables_and_resolves_paths_against_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, """
landing: landing
lake: /abs/lake
transaction_timeout: 30
tables:
  payments.customers: {key: [id], mask: [email, phone]}
  inventory.Products: {key: [id, region], name: items}
""")
    cfg = load_config(path)
    assert cfg.landing == (tmp_path / "conf" / "landing").resolve()
    assert cfg.lake == Path("/abs/lake")
    assert cfg.checkpoint_dir == Path("/abs/lake/_checkpoints/ingest")
    assert cfg.transaction_timeout == 30.0
    customers, items = cfg.tables
    assert (customers.name, customers.key, customers.mask) == ("customers", ("id",), ("email", "phone"))
    assert (items.source, items.name, items.key) == ("inventory.Products", "items", ("id", "region"))
    assert cfg.table_for_source("payments.customers") is customers
    assert cfg.keys_by_source == {"payments.customers": ("id",), "inventory.Products": ("id", "region")}


def test_default_lake_name_is_the_lower_cased_table_part(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "landing: l\nlake: k\ntables:\n  inventory.Products: {key: [id]}\n"))
    assert cfg.tables[0].name == "products"


def test_flags_override_the_file_and_the_env_var_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "landing: landing\nlake: lake\n")
    cfg = load_config(None, lake=tmp_path / "elsewhere", environ={"CDC_CONFIG": str(path)})
    assert cfg.lake == (tmp_path / "elsewhere").resolve()
    assert cfg.landing == (tmp_path / "conf" / "landing").resolve()
    flags_only = load_config(None, landing=tmp_path / "a", lake=tmp_path / "b", environ={})
    assert flags_only.tables == () and flags_only.source_file is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("landing: l\nlake: k\nlakes: x\n", "unknown key(s) lakes"),
        ("landing: l\nlake: k\ntables:\n  p.c: {keys: [id]}\n", "tables.p.c: unknown key(s) keys"),
        ("landing: l\nlake: k\ntables:\n  p.c: {mask: [email]}\n", "tables.p.c.key is required"),
        ("landing: l\nlake: k\ntables:\n  p.c: {key: []}\n", "non-empty list"),
        ("landing: l\nlake: k\ntables:\n  customers: {key: [id]}\n", "'<db-or-schema>.<table>'"),
        ("landing: l\nlake: k\ntables:\n  a.c: {key: [id]}\n  b.c: {key: [id]}\n", "lake name 'c' is already used by tables.a.c"),
        ("landing: l\nlake: k\ntables:\n  a.dead_letter: {key: [id]}\n", "reserved for a platform table"),
        ("landing: l\nlake: k\ntables:\n  a.c: {key: [id], name: '../x'}\n", "not a usable lake name"),
        ("landing: l\nlake: k\ntables:\n  a.c: {key: [id], mask: [id]}\n", "cannot be masked"),
        ("landing: l\nlake: k\ntables:\n  a.c: {key: ['id; drop']}\n", "not a valid column name"),
        ("landing: l\nlake: k\ntransaction_timeout: -1\n", "transaction_timeout"),
        ("landing: l\nlake: k\ntrigger_interval: soon\n", "trigger_interval"),
        ("landing: l\nlake: k\nstage_trigger_interval: later\n", "stage_trigger_interval"),
        ("landing: l\nlake: k\nparse_workers: 2\n", "`parse_workers` is gone: lines are parsed on Spark's executors"),
        ("lake: k\n", "no landing directory"),
        ("- a\n- b\n", "mapping at the top level"),
        ("landing: [\n", "not valid YAML"),
        ("landing: l\nlake: k\nspark_master: spark:/host:7077\n", "`spark_master` must be a Spark master URL"),
        ("landing: l\nlake: k\nspark_master: spark://host\n", "`spark_master` must be a Spark master URL"),
        ("landing: l\nlake: gs://bucket/lake\n", "on `gs://`; a lake is a local path or on S3"),
        ("landing: l\nlake: s3a://B_ad/lake\n", "does not start with a valid bucket name"),
        ("landing: s3://bucket/landing\nlake: k\n", "`landing` is a URL (s3://bucket/landing); it must be a path on this machine"),
        ("landing: l\nlake: k\nobject_store: {endpoint: 127.0.0.1:9000}\n", "`object_store.endpoint` must be an http(s)://host[:port] URL"),
        ("landing: l\nlake: k\nobject_store: {secret_key: x}\n", "credentials come from AWS_ACCESS_KEY_ID"),
        ("landing: l\nlake: k\nobject_store: {path_style_access: yes please}\n", "must be true or false"),
    ],
)
def test_rejections_name_the_offending_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert message in str(err.value)


def test_missing_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config FILE or set CDC_CONFIG"):
        load_config(tmp_path / "nope.yaml")


def test_spark_master_comes_from_the_file_and_the_flag_wins(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "landing: l\nlake: k\n")).spark_master is None  # local[2], or spark-submit's
    path = write(tmp_path, "landing: l\nlake: k\nspark_master: spark://10.0.0.5:7077\n")
    assert load_config(path).spark_master == "spark://10.0.0.5:7077"
    assert load_config(path, spark_master="local[4]").spark_master == "local[4]"
    with pytest.raises(ConfigError, match="--master must be a Spark master URL"):
        load_config(path, spark_master="spark//x:1")
    with pytest.raises(ConfigError, match="on `abfss://`"):
        load_config(path, lake="abfss://c@acct.dfs.core.windows.net/lake")


def test_a_lake_on_an_object_store_carries_the_store_settings_to_every_client(tmp_path: Path) -> None:
    from upath import UPath

    from cdc_platform import storage

    text = "landing: l\nlake: s3://lakes/prod/cdc/\nobject_store: {endpoint: 'http://127.0.0.1:9000/', region: eu-west-1, path_style_access: true}\n"
    env = {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    config = load_config(write(tmp_path, text), environ=env)
    assert isinstance(config.lake, UPath) and str(config.lake) == "s3a://lakes/prod/cdc"  # Hadoop's scheme, no trailing /
    assert config.lake_is_remote and not isinstance(config.landing, UPath)
    assert "s3cr3t" not in repr(config.object_store)
    table = config.lake / "orders"  # a table path keeps the store's settings: no module needs the config to reach it
    assert storage.delta_rs_options(table) == {
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    }
    hadoop = storage.hadoop_options(table)
    assert hadoop["fs.s3a.bucket.lakes.endpoint"] == "http://127.0.0.1:9000"
    assert hadoop["fs.s3a.bucket.lakes.path.style.access"] == "true"
    assert hadoop["fs.s3a.bucket.lakes.connection.ssl.enabled"] == "false"
    assert hadoop["fs.s3a.bucket.lakes.aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    assert str(config.checkpoint_dir) == "s3a://lakes/prod/cdc/_checkpoints/ingest"
    assert storage.delta_rs_options(config.landing) is None

    # Without credentials each client keeps its own default chain (instance profile, ~/.aws): none is forced.
    plain = load_config(write(tmp_path, "landing: l\nlake: s3a://lakes/x\n"), environ={})
    assert storage.hadoop_options(plain.lake) == {"fs.s3a.bucket.lakes.path.style.access": "false"}
    with pytest.raises(ConfigError, match="set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        load_config(write(tmp_path, "landing: l\nlake: s3a://lakes/x\n"), environ={"AWS_ACCESS_KEY_ID": "AKIA1"})


def test_a_lake_on_s3_without_s3fs_says_which_extra_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from cdc_platform.errors import EnvironmentNotReadyError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "s3fs" else real(name, *a))
    with pytest.raises(EnvironmentNotReadyError, match=r"pip install 'cdc-platform\[object-store\]'"):
        load_config(write(tmp_path, "landing: l\nlake: s3a://lakes/x\n"), environ={})
    assert load_config(write(tmp_path, "landing: l\nlake: k\n"), environ={}).lake == (tmp_path / "conf" / "k").resolve()  # a local lake never asks


def test_the_stage_queries_cadence_is_the_ingests_unless_set(tmp_path) -> None:  # noqa: ANN001
    plain = tmp_path / "a.yaml"
    plain.write_text("landing: l\nlake: k\ntrigger_interval: 2 seconds\n", encoding="utf-8")
    assert load_config(plain).stage_trigger_interval is None
    slower = tmp_path / "b.yaml"
    slower.write_text("landing: l\nlake: k\nstage_trigger_interval: 30\n", encoding="utf-8")
    assert load_config(slower).stage_trigger_interval == "30 seconds"

