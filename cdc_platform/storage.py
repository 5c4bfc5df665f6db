"""Where the lake lives: a local folder (the embedded default) or an object store (`s3a://bucket/prefix`).

Three clients touch a lake: Spark (Hadoop's S3A filesystem from hadoop-aws, for every table write and
read), delta-rs (the driver's small log reads, `lake`) and fsspec (the registry file, the stream
checkpoint's metadata). A lake on an object store is therefore one `UPath` (universal_pathlib over
s3fs) that carries the store's settings: every `lake / name` made from it keeps them, so a module that
joins paths never needs the config, and each client's settings are derived here from that one object.

Settings come from `object_store:` in cdc.yaml (endpoint, region, path-style addressing, for MinIO,
Ceph or a test server) and the credentials from the standard AWS environment variables, read once by
`load_config`. Without credentials every client falls back to its own default chain (instance
profile, web identity, ~/.aws), as it does on a cluster node.

Spark learns a bucket's settings as Hadoop per-bucket options (`fs.s3a.bucket.<bucket>.*`) the first
time a path of that bucket becomes a Spark location, so two lakes on two endpoints can share one
session. The S3A jars are not loaded unless asked for (`get_spark(object_store=True)`): the AWS SDK
bundle is 641 MB, and a standalone cluster would copy it to every executor.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, Union

from cdc_platform.errors import ConfigError, EnvironmentNotReadyError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from upath import UPath

#: A lake, or a table in it: a local path, or a `UPath` on an object store. universal_pathlib (and fsspec under it)
#: is imported only when a lake on a store is named (`lake_location`): ~0.2 s that a local lake's `cdc sql` or
#: `cdc --help` does not pay.
LakePath = Union[Path, "UPath"]

#: URL schemes a lake may use. `s3://` is taken and written as `s3a://`, the scheme Hadoop's S3A
#: filesystem answers (Hadoop 3 has no `s3://` filesystem, so Spark would fail on it).
OBJECT_STORE_SCHEMES = ("s3a", "s3")
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_OBJECT_STORE_KEYS = {"endpoint", "region", "path_style_access"}
#: The standard AWS variables, read by `load_config` (never elsewhere) and passed to all three clients.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class ObjectStoreConfig:
    """`object_store:` in cdc.yaml, plus the credentials the environment gave (never printed)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:9000 for MinIO; None: AWS's own endpoint for the region
    region: str | None = None
    path_style_access: bool = False  # http://host/bucket/key rather than http://bucket.host/key (MinIO, Ceph, moto)
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)


def parse_object_store(value: Any, where: str, environ: Mapping[str, str]) -> ObjectStoreConfig:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: `object_store` must be a mapping (endpoint, region, path_style_access)")
    unknown = sorted(set(value) - _OBJECT_STORE_KEYS)
    if unknown:
        hint = "; credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, never from the file" if any("key" in u or "secret" in u for u in unknown) else ""
        raise ConfigError(f"{where}: unknown key(s) in `object_store`: {', '.join(unknown)}; allowed: {', '.join(sorted(_OBJECT_STORE_KEYS))}{hint}")
    endpoint, region, path_style = value.get("endpoint"), value.get("region"), value.get("path_style_access", False)
    if endpoint is not None and (not isinstance(endpoint, str) or not re.match(r"^https?://[^/\s]+/?$", endpoint)):
        raise ConfigError(f"{where}: `object_store.endpoint` must be an http(s)://host[:port] URL, got {endpoint!r}")
    if region is not None and (not isinstance(region, str) or not re.match(r"^[a-z0-9\-]+$", region)):
        raise ConfigError(f"{where}: `object_store.region` must be a region name such as us-east-1, got {region!r}")
    if not isinstance(path_style, bool):
        raise ConfigError(f"{where}: `object_store.path_style_access` must be true or false, got {path_style!r}")
    key, secret, token = (environ.get(name) or None for name in CREDENTIAL_VARIABLES)
    if (key is None) != (secret is None):
        raise ConfigError("set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither (then the default AWS credential chain applies)")
    return ObjectStoreConfig(endpoint.rstrip("/") if endpoint else None, region, path_style, key, secret, token)


def is_url(value: str) -> bool:
    return _URL_RE.match(value) is not None


def lake_location(url: str, store: ObjectStoreConfig, what: str) -> UPath:
    """The lake (or a checkpoint) at an object-store URL, carrying the store's settings."""
    m = _URL_RE.match(url)
    if m is None:
        raise ConfigError(f"{what}: {url!r} is not a URL")
    scheme, rest = m.group(1).lower(), m.group(2).strip("/")
    if scheme not in OBJECT_STORE_SCHEMES:
        raise ConfigError(
            f"{what}: {url} is on `{scheme}://`; a lake is a local path or on S3 (or an S3-compatible store) as "
            "s3a://bucket/prefix. Other stores (gs://, abfss://) are not supported by this version"
        )
    bucket = rest.split("/", 1)[0]
    if not _BUCKET_RE.match(bucket):
        raise ConfigError(f"{what}: {url} does not start with a valid bucket name (s3a://bucket/prefix)")
    if importlib.util.find_spec("s3fs") is None:  # else fsspec fails at the first file, far from the cause
        raise EnvironmentNotReadyError(
            f"{what}: a lake on S3 needs fsspec's S3 filesystem for the driver's files: pip install 'cdc-platform[object-store]' "
            "(s3fs), and `make setup-object-store` for Spark's side"
        )
    options: dict[str, Any] = {}
    if store.access_key is not None:
        options.update(key=store.access_key, secret=store.secret_key)
        if store.session_token is not None:
            options["token"] = store.session_token
    client = {k: v for k, v in (("endpoint_url", store.endpoint), ("region_name", store.region)) if v is not None}
    if client:
        options["client_kwargs"] = client
    if store.path_style_access:
        options["config_kwargs"] = {"s3": {"addressing_style": "path"}}
    from upath import UPath

    return UPath(f"s3a://{rest}", **options)


def is_remote(path: object) -> TypeGuard[UPath]:
    upath = sys.modules.get("upath")  # not imported: no path is a UPath
    return upath is not None and isinstance(path, upath.UPath) and getattr(path, "protocol", "") in OBJECT_STORE_SCHEMES


def ensure_dir(path: LakePath) -> None:
    """mkdir -p for a local folder; nothing on an object store, which has no folders (and where s3fs's
    mkdir would create a missing bucket, in whatever region the client defaults to)."""
    if not is_remote(path):
        path.mkdir(parents=True, exist_ok=True)


def machine_dir(lake: LakePath) -> Path:
    """Where this machine keeps its own files about a lake (`cdc serve`'s state file and Hive scratch
    folders): the lake itself when it is local, else a folder under ~/.cache named by the lake's URL.
    A server's state names a process on this machine, so it does not belong in a shared bucket."""
    if not is_remote(lake):
        return Path(lake)
    digest = hashlib.sha256(str(lake).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "cdc-platform" / "lakes" / f"{bucket_of(lake)}-{digest}"  # type: ignore[arg-type]


def bucket_of(path: UPath) -> str:
    return str(path).split("://", 1)[1].split("/", 1)[0]


def _settings(path: UPath) -> tuple[str | None, str | None, str | None, str | None, str | None, bool]:
    opts = path.storage_options
    client = opts.get("client_kwargs", {})
    path_style = opts.get("config_kwargs", {}).get("s3", {}).get("addressing_style") == "path"
    return client.get("endpoint_url"), client.get("region_name"), opts.get("key"), opts.get("secret"), opts.get("token"), path_style


def delta_rs_options(path: object) -> dict[str, str] | None:
    """delta-rs `storage_options` for a table on the object store; None for a local table."""
    if not is_remote(path):
        return None
    endpoint, region, key, secret, token, path_style = _settings(path)
    options = {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if path_style else "true"}
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if region:
        options["AWS_REGION"] = region
    if key:
        options.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret or "")
        if token:
            options["AWS_SESSION_TOKEN"] = token
    return options


def hadoop_options(path: UPath) -> dict[str, str]:
    """Hadoop S3A per-bucket options for the path's bucket (only what the config or environment set)."""
    endpoint, region, key, secret, token, path_style = _settings(path)
    prefix = f"fs.s3a.bucket.{bucket_of(path)}."
    options = {prefix + "path.style.access": "true" if path_style else "false"}
    if endpoint:
        options[prefix + "endpoint"] = endpoint
        options[prefix + "connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
    if region:
        options[prefix + "endpoint.region"] = region
    if key:
        options[prefix + "access.key"] = key
        options[prefix + "secret.key"] = secret or ""
        if token:
            options[prefix + "session.token"] = token
            options[prefix + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            options[prefix + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return options


_CONFIGURED: dict[tuple[str, str], dict[str, str]] = {}
_LOCK = threading.Lock()


def spark_location(spark: SparkSession | None, path: LakePath | str) -> str:
    """The path as Spark takes it; for an object store, after the session learned the bucket's settings.

    The options go into the driver's Hadoop configuration, which every Delta log access, checkpoint
    and job (whose Hadoop configuration ships to the executors) starts from. They are set before the
    bucket's first use: Hadoop caches a filesystem per bucket with the options it was created with.
    """
    if not is_remote(path):
        return str(path)
    if spark is not None:
        options = hadoop_options(path)
        # By application, not id(): a stopped session's id may be reused by the next one, which must learn the options again.
        key = (spark.sparkContext.applicationId, bucket_of(path))
        with _LOCK:
            if _CONFIGURED.get(key) != options:  # once per session and bucket, not on every location
                from cdc_platform.spark.session import require_object_store

                require_object_store(str(path))
                conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
                for name, value in options.items():
                    conf.set(name, value)
                _CONFIGURED[key] = options
    return str(path)
