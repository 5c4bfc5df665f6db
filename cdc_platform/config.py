"""One typed configuration object for every entry point (CLI, streaming job, Dagster).

The file is YAML (`cdc.yaml`). Its path comes from `--config` or, failing that, `CDC_CONFIG`; CLI flags
override what the file says. Relative paths resolve against the file's directory so a config can travel
with its data. Unknown keys are rejected instead of ignored: a typo such as `keys:` for `key:` would
otherwise silently produce a table with no latest state.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config_outbox import OutboxConfig, check_outbox_source, parse_outbox
from cdc_platform.config_serve import ServeConfig, parse_serve
from cdc_platform.config_source import SourceConfig, parse_source
from cdc_platform.errors import ConfigError
from cdc_platform.sources.signal_channel import RepairConfig, parse_repair
from cdc_platform.sources.source_connection import SourceConnection, parse_source_connection
from cdc_platform.storage import LakePath, ObjectStoreConfig, is_remote, is_url, lake_location, parse_object_store

CONFIG_ENV_VAR = "CDC_CONFIG"

#: Lake table names the platform owns; a configured table may not take one of them.
SYSTEM_TABLES: tuple[str, ...] = (
    "raw_change_events",
    "transaction_markers",
    "dead_letter",
    "pipeline_metrics",
    "stage_progress",
    "transactions",
    "incomplete_transactions",
    "late_transaction_events",
    "open_transactions",
    "consistency_watermark",
    "source_repairs",
)

LAKE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,127}$")  # no leading _: the lake keeps its own state in _dirs
SOURCE_PART_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$\-]{0,127}$")
COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,127}$")

_TOP_KEYS = {
    "landing",
    "lake",
    "checkpoint",
    "tables",
    "trigger_interval",
    "stage_trigger_interval",
    "max_files_per_trigger",
    "parse_workers",  # removed (parsing moved onto the executors); known only to be refused with that reason
    "transaction_timeout",
    "transaction_retention",
    "snapshots",
    "freshness_slo",
    "spark_master",
    "source",
    "catalog",
    "source_connection",
    "repair",
    "object_store",
    "serve",
    "outbox",
}
_CATALOG_KEYS = {"schema"}
#: The schema (database) `cdc serve` registers the lake's tables and views under, unless `catalog.schema` says.
DEFAULT_CATALOG_SCHEMA = "cdc"
#: A schema name Spark, Hive's JDBC URL and every BI tool take unquoted.
CATALOG_SCHEMA_RE = re.compile(r"^[a-z][a-z0-9_]{0,127}$")
_TABLE_KEYS = {"key", "mask", "name", "mask_mode", "mask_salt_env", "history", "tombstone_retention"}
MASK_MODES = ("hash", "remove")
DEFAULT_MASK_SALT_ENV = "CDC_MASK_SALT"
DEFAULT_TOMBSTONE_RETENTION = 7 * 86_400.0  # seconds: how long a delete keeps stale changes out
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|seconds?|m|minutes?|h|hours?|d|days?)$")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}
#: Spark master URLs: local[N], a standalone cluster spark://host:port[,host:port], yarn, k8s://..., local-cluster[...].
SPARK_MASTER_RE = re.compile(
    r"^(local(\[(\d+|\*)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
    r"|spark://[A-Za-z0-9.\-\[\]:]+:\d+(,[A-Za-z0-9.\-\[\]:]+:\d+)*|yarn|k8s://\S+)$"
)

#: Files per micro-batch. Every batch pays a fixed cost (Spark jobs, some ten Delta commits), so
#: bigger batches catch up faster: on the 1M benchmark 200 files a batch took 433 s, 1,000 took 225 s
#: (benchmarks/README.md). A batch is parsed and held on the executors, never on the driver.
DEFAULT_MAX_FILES_PER_TRIGGER = 1_000


@dataclass(frozen=True)
class TableConfig:
    """A source table the platform keeps a latest state for."""

    source: str  # "<db-or-schema>.<table>", as the connector names it
    name: str  # lake name: directory and SQL name
    key: tuple[str, ...]
    mask: tuple[str, ...] = ()
    # How `<name>__clean_view` masks: "hash" (salted SHA-256, joins still work) or "remove" (column dropped).
    mask_mode: str = "hash"
    # The environment variable holding the hash salt; the lake records its name, never the salt.
    mask_salt_env: str = DEFAULT_MASK_SALT_ENV
    history: bool = False  # keep `<name>_history` (SCD2)
    tombstone_retention: float = DEFAULT_TOMBSTONE_RETENTION  # seconds

    @property
    def history_name(self) -> str:
        return f"{self.name}_history"

    def to_registry(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.name,
            "key": list(self.key),
            "mask": list(self.mask),
            "mask_mode": self.mask_mode,
            "mask_salt_env": self.mask_salt_env,
            "history": self.history,
            "tombstone_retention": self.tombstone_retention,
        }

    @classmethod
    def from_registry(cls, entry: Mapping[str, Any]) -> TableConfig:
        return cls(
            source=str(entry["source"]),
            name=str(entry["name"]),
            key=tuple(entry["key"]),
            mask=tuple(entry.get("mask", ())),
            mask_mode=str(entry.get("mask_mode", "hash")),
            mask_salt_env=str(entry.get("mask_salt_env", DEFAULT_MASK_SALT_ENV)),
            history=bool(entry.get("history", False)),
            tombstone_retention=float(entry.get("tombstone_retention", DEFAULT_TOMBSTONE_RETENTION)),
        )


def mask_salt(table: TableConfig, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The salt for hashed masking, from the variable the table names; None when it is unset or empty.

    Read here, like every other environment lookup, so that `cdc sql --lake` (which has no config
    file) and the stream agree on where the salt comes from.
    """
    env = os.environ if environ is None else environ
    value = env.get(table.mask_salt_env)
    return value.encode("utf-8") if value else None


def parse_duration(value: Any, entry: str) -> float:
    """Seconds from a number or a string like '7 days', '12 hours', '90 minutes', '30 s'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if m:
            return float(m.group(1)) * _DURATION_UNITS[m.group(2)[0]]
    raise ConfigError(f"{entry} must be a duration such as '7 days', '12 hours' or a number of seconds, got {value!r}")


@dataclass(frozen=True)
class CatalogConfig:
    """Where the lake's tables and views are registered by name (`catalog:` in cdc.yaml).

    One schema (database) holds them all, so a BI tool's JDBC URL (`.../<schema>`) or a notebook's
    `USE <schema>` reaches every table and view of one lake; two lakes served at once need two names.
    """

    schema: str = DEFAULT_CATALOG_SCHEMA


@dataclass(frozen=True)
class PlatformConfig:
    """Everything a run needs. Build it with `load_config`; never read the environment elsewhere."""

    landing: Path
    lake: LakePath  # a local path, or a UPath on an object store (`s3a://bucket/prefix`, storage.py)
    tables: tuple[TableConfig, ...] = ()
    checkpoint: LakePath | None = None
    trigger_interval: str = "5 seconds"
    #: `cdc stream`'s stage queries (the fold, the transactions); None: `trigger_interval`. Slower than the ingest,
    #: a busy source keeps the cores for the raw log, which is what the full views read, and bigger stage
    #: batches cost less per event; the consistent views and the stored tables then lag by about that much.
    stage_trigger_interval: str | None = None
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER
    transaction_timeout: float = 60.0
    #: How long (event time) a finished transaction is remembered so late arrivals get its fate; None: 5 x timeout.
    transaction_retention: float | None = None
    snapshots: Path | None = None  # backfill snapshots, `<snapshots>/<table name>/`; default `<config dir>/snapshots`
    freshness_slo: float = 900.0  # seconds from a source commit to the lake before the freshness check fails
    #: Where Spark runs: None is spark-submit's --master when submitted, else local[2]; or spark://host:port, yarn, ...
    spark_master: str | None = None
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    source_file: Path | None = field(default=None, compare=False)
    source: SourceConfig = field(default_factory=SourceConfig)  # `landing` is not read when it is Kafka
    #: The source database itself, for coverage against the live source; None: that check is not built.
    source_connection: SourceConnection | None = None
    #: How a failed source coverage is repaired: Debezium's signal channel and the bounds (`repair:`).
    repair: RepairConfig = field(default_factory=RepairConfig)
    #: Endpoint, region and addressing of the object store the lake is on (`object_store:`), with the
    #: credentials the environment gave; unused for a local lake.
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    #: `cdc serve`: address, logins, TLS and what it exposes (`serve:`; config_serve.py).
    serve: ServeConfig = field(default_factory=ServeConfig)
    #: Services' outbox events landed as event tables (`outbox:`; config_outbox.py); None: no outbox.
    outbox: OutboxConfig | None = None

    @property
    def lake_is_remote(self) -> bool:
        return is_remote(self.lake) or is_remote(self.checkpoint)

    @property
    def checkpoint_dir(self) -> LakePath:
        """The stream's checkpoint lives in the lake so that moving the lake moves its progress.

        Each source kind has its own: a checkpoint records one source's offsets (file names or Kafka
        offsets), and Spark fails obscurely on the other kind's. Switching kinds therefore starts a new
        stream (a new query id), whose first batch re-reads from `starting_offsets`; the raw log's
        identity dedup keeps what was already landed from landing twice.
        """
        if self.checkpoint is not None:
            return self.checkpoint
        return self.lake / "_checkpoints" / ("ingest" if self.source.kind == "files" else f"ingest_{self.source.kind}")

    def describe_source(self) -> str:
        """One line naming what the stream reads, for progress messages."""
        return str(self.landing) if self.source.kafka is None else self.source.kafka.describe()

    def table_for_source(self, source: str) -> TableConfig | None:
        for table in self.tables:
            if table.source == source:
                return table
        return None

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        known = ", ".join(t.name for t in self.tables) or "none"
        raise ConfigError(f"no configured table is named {name!r} (configured: {known}); add it under `tables:`")

    @property
    def keys_by_source(self) -> dict[str, tuple[str, ...]]:
        return {t.source: t.key for t in self.tables}


def resolve_config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """`--config` wins over `CDC_CONFIG`; neither means flags only."""
    if explicit:
        return Path(explicit)
    env = os.environ if environ is None else environ
    value = env.get(CONFIG_ENV_VAR)
    return Path(value) if value else None


def lake_from_flag(value: str, environ: Mapping[str, str] | None = None) -> LakePath:
    """`--lake` given without `--config`: a local folder, or an object-store URL with the `object_store:`
    settings of the config `CDC_CONFIG` names, if any, else the AWS defaults (and its credentials)."""
    env = os.environ if environ is None else environ
    if not is_url(value):
        return Path(value).resolve()
    config_path = resolve_config_path(None, env)
    if config_path is not None:
        return load_config(config_path, lake=value, environ=env).lake
    return lake_location(value, parse_object_store(None, "--lake", env), "--lake")


def _interval(raw: dict[str, Any], key: str, default: str, where: str) -> str:
    """A trigger interval as Spark takes it ('5 seconds'); a bare number is seconds."""
    interval = raw.get(key, default)
    if isinstance(interval, (int, float)) and not isinstance(interval, bool):
        interval = f"{interval} seconds"
    if not isinstance(interval, str) or not re.match(r"^\d+(\.\d+)?\s*(ms|milliseconds?|s|seconds?|minutes?)$", interval.strip()):
        raise ConfigError(f"{where}: `{key}` must look like '5 seconds' or '500 milliseconds', got {interval!r}")
    return interval.strip()


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    landing: str | os.PathLike[str] | None = None,
    lake: str | os.PathLike[str] | None = None,
    spark_master: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> PlatformConfig:
    """Load the YAML file (if any) and apply flag overrides; raise `ConfigError` naming the bad entry."""
    config_path = resolve_config_path(path, environ)
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if config_path is not None:
        if not config_path.is_file():
            raise ConfigError(f"config file {config_path} does not exist; pass --config FILE or set {CONFIG_ENV_VAR}")
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_path} must hold a mapping at the top level, found {type(loaded).__name__}")
        raw = loaded
        base = config_path.resolve().parent
    where = str(config_path) if config_path else "flags"
    return parse_config(raw, base=base, where=where, landing=landing, lake=lake, spark_master=spark_master, source_file=config_path,
                        environ=os.environ if environ is None else environ)


def parse_config(
    raw: Mapping[str, Any],
    *,
    base: Path,
    where: str = "config",
    landing: str | os.PathLike[str] | None = None,
    lake: str | os.PathLike[str] | None = None,
    spark_master: str | None = None,
    source_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> PlatformConfig:
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    object_store = parse_object_store(raw.get("object_store"), where, os.environ if environ is None else environ)

    def path_of(key: str, override: str | os.PathLike[str] | None, remote_ok: bool = False) -> Any:
        value = raw.get(key) if override is None else os.fspath(override)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: `{key}` must be a path string")
        if is_url(value):  # Path() would quietly make "s3a://b/x" a local folder "s3a:/b/x"
            if not remote_ok:
                raise ConfigError(f"{where}: `{key}` is a URL ({value}); it must be a path on this machine (only the lake "
                                  "and its checkpoint may be on an object store)")
            return lake_location(value, object_store, f"{where}: `{key}`")
        if override is not None:
            return Path(value).resolve()
        p = Path(value)
        return (p if p.is_absolute() else base / p).resolve()

    source = parse_source(raw.get("source"), where)
    landing_path = path_of("landing", landing)
    lake_path = path_of("lake", lake, remote_ok=True)
    if landing_path is None and source.kind == "kafka":
        landing_path = (base / "landing").resolve()  # not read by a Kafka stream; kept so the type stays a Path
    if landing_path is None:
        raise ConfigError(f"{where}: no landing directory; set `landing:` in the config or pass --landing DIR")
    if lake_path is None:
        raise ConfigError(f"{where}: no lake directory; set `lake:` in the config or pass --lake DIR")

    tables = _parse_tables(raw.get("tables") or {}, where)
    checkpoint = path_of("checkpoint", None, remote_ok=True)

    interval = _interval(raw, "trigger_interval", "5 seconds", where)
    stage_interval = _interval(raw, "stage_trigger_interval", interval, where) if "stage_trigger_interval" in raw else None

    max_files = raw.get("max_files_per_trigger", DEFAULT_MAX_FILES_PER_TRIGGER)
    if not isinstance(max_files, int) or isinstance(max_files, bool) or max_files < 1:
        raise ConfigError(f"{where}: `max_files_per_trigger` must be a positive integer, got {max_files!r}")

    if "parse_workers" in raw:
        raise ConfigError(
            f"{where}: `parse_workers` is gone: lines are parsed on Spark's executors now, as many at once as the "
            "cluster has cores (`spark_master`); delete the setting"
        )

    timeout = raw.get("transaction_timeout", 60)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"{where}: `transaction_timeout` must be a positive number of seconds, got {timeout!r}")
    slo = raw.get("freshness_slo", 900)
    if not isinstance(slo, (int, float)) or isinstance(slo, bool) or slo <= 0:
        raise ConfigError(f"{where}: `freshness_slo` must be a positive number of seconds, got {slo!r}")

    retention = raw.get("transaction_retention")
    if retention is not None and (not isinstance(retention, (int, float)) or isinstance(retention, bool) or retention < timeout):
        raise ConfigError(
            f"{where}: `transaction_retention` must be a number of seconds at least `transaction_timeout` ({timeout}), got {retention!r}"
        )

    master = check_spark_master(
        spark_master if spark_master is not None else raw.get("spark_master"), "--master" if spark_master is not None else f"{where}: `spark_master`"
    )

    catalog = parse_catalog(raw.get("catalog"), where)
    source_connection = parse_source_connection(raw.get("source_connection"), where)
    repair = parse_repair(raw.get("repair"), where, source.kafka.bootstrap_servers if source.kafka is not None else None, environ)
    outbox = parse_outbox(raw.get("outbox"), where)
    check_outbox_source(outbox, source.kafka, where)

    return PlatformConfig(
        catalog=catalog,
        landing=landing_path,
        lake=lake_path,
        tables=tables,
        checkpoint=checkpoint,
        trigger_interval=interval,
        stage_trigger_interval=stage_interval,
        max_files_per_trigger=max_files,
        transaction_timeout=float(timeout),
        transaction_retention=None if retention is None else float(retention),
        snapshots=path_of("snapshots", None) or (base / "snapshots").resolve(),
        freshness_slo=float(slo),
        spark_master=master,
        source_file=source_file,
        source=source,
        source_connection=source_connection,
        repair=repair,
        object_store=object_store,
        serve=parse_serve(raw.get("serve"), where, base),
        outbox=outbox,
    )


def check_catalog_schema(value: Any, where: str = "--schema") -> str:
    """A schema name for the catalog; a name a JDBC URL cannot carry unquoted fails here, not in Spark."""
    if not isinstance(value, str) or not CATALOG_SCHEMA_RE.match(value):
        raise ConfigError(f"{where} must be a lower-case name of letters, digits and _ starting with a letter (e.g. cdc), got {value!r}")
    return value


def parse_catalog(raw: Any, where: str) -> CatalogConfig:
    if raw is None:
        return CatalogConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: `catalog` must be a mapping such as `catalog: {{schema: cdc}}`, got {raw!r}")
    unknown = sorted(set(raw) - _CATALOG_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) catalog.{', catalog.'.join(unknown)}; allowed: {', '.join(sorted(_CATALOG_KEYS))}")
    return CatalogConfig(schema=check_catalog_schema(raw.get("schema", DEFAULT_CATALOG_SCHEMA), f"{where}: `catalog.schema`"))


def check_spark_master(value: Any, where: str = "--master") -> str | None:
    """A Spark master URL (local[N], spark://host:port, yarn, k8s://...), or None; a typo fails here, not in the JVM."""
    if value is None:
        return None
    if not isinstance(value, str) or not SPARK_MASTER_RE.match(value.strip()):
        raise ConfigError(f"{where} must be a Spark master URL such as local[2], spark://host:7077 or yarn, got {value!r}")
    return value.strip()


def _parse_tables(raw_tables: Any, where: str) -> tuple[TableConfig, ...]:
    if not isinstance(raw_tables, dict):
        raise ConfigError(f"{where}: `tables` must be a mapping of '<db-or-schema>.<table>' to settings")
    tables: list[TableConfig] = []
    names: dict[str, str] = {}
    for source, settings in raw_tables.items():
        entry = f"{where}: tables.{source}"
        parts = str(source).split(".")
        if len(parts) != 2 or not all(SOURCE_PART_RE.match(p) for p in parts):
            raise ConfigError(f"{entry}: the key must be '<db-or-schema>.<table>' made of letters, digits and _")
        if not isinstance(settings, dict):
            raise ConfigError(f"{entry}: settings must be a mapping with at least `key: [columns]`")
        unknown = sorted(set(settings) - _TABLE_KEYS)
        if unknown:
            raise ConfigError(f"{entry}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TABLE_KEYS))}")
        key = _column_list(settings.get("key"), f"{entry}.key", required=True)
        mask = _column_list(settings.get("mask"), f"{entry}.mask", required=False)
        overlap = sorted(set(key) & set(mask))
        if overlap:
            raise ConfigError(f"{entry}: key column(s) {', '.join(overlap)} cannot be masked; joins need the key")
        mask_mode = settings.get("mask_mode", "hash")
        if mask_mode not in MASK_MODES:
            raise ConfigError(f"{entry}.mask_mode must be one of {', '.join(MASK_MODES)}, got {mask_mode!r}")
        salt_env = settings.get("mask_salt_env", DEFAULT_MASK_SALT_ENV)
        if not isinstance(salt_env, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", salt_env):
            raise ConfigError(f"{entry}.mask_salt_env must name an environment variable (letters, digits, _), got {salt_env!r}")
        history = settings.get("history", False)
        if not isinstance(history, bool):
            raise ConfigError(f"{entry}.history must be true or false, got {history!r}")
        retention = parse_duration(settings.get("tombstone_retention", DEFAULT_TOMBSTONE_RETENTION), f"{entry}.tombstone_retention")
        name = settings.get("name", parts[1].lower())
        if not isinstance(name, str) or not LAKE_NAME_RE.match(name) or "__" in name:
            raise ConfigError(
                f"{entry}.name: {name!r} is not a usable lake name; use lower-case letters, digits and single "
                "underscores (set `name:` explicitly when the table part is not one)"
            )
        if name in SYSTEM_TABLES:
            raise ConfigError(f"{entry}: lake name {name!r} is reserved for a platform table; set another `name:`")
        if name in names:
            raise ConfigError(f"{entry}: lake name {name!r} is already used by tables.{names[name]}; set `name:` on one of them")
        names[name] = str(source)
        tables.append(
            TableConfig(
                source=str(source), name=name, key=key, mask=mask, mask_mode=mask_mode, mask_salt_env=salt_env,
                history=history, tombstone_retention=retention,
            )
        )
    for t in tables:
        if t.history and (t.history_name in names or t.history_name in SYSTEM_TABLES):
            raise ConfigError(
                f"{where}: tables.{t.source} keeps history in {t.history_name!r}, which another table or the platform "
                "already uses; set `name:` on one of them"
            )
    return tuple(tables)


def _column_list(value: Any, entry: str, *, required: bool) -> tuple[str, ...]:
    if value is None:
        if required:
            raise ConfigError(f"{entry} is required: list the primary-key column(s), e.g. `key: [id]`")
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (required and not value):
        raise ConfigError(f"{entry} must be a non-empty list of column names")
    for col in value:
        if not isinstance(col, str) or not COLUMN_RE.match(col):
            raise ConfigError(f"{entry}: {col!r} is not a valid column name")
    if len(set(value)) != len(value):
        raise ConfigError(f"{entry}: a column is listed twice")
    return tuple(value)


def with_overrides(config: PlatformConfig, **changes: Any) -> PlatformConfig:
    return replace(config, **changes)
