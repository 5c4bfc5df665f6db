"""Resolve the platform's JVM artifacts (jvm/pom.xml) with Maven into jvm/jars/, and build the envelope parser
(jvm/parser/) into jvm/parser/jars/, for `make setup`.

Spark loads these jars through `spark.jars` (cdc_platform/session.py), so nothing is resolved when a
session starts and a run needs no network. This script is the only place that talks to Maven:

* It is a no-op (well under a second, offline) while the manifest in jvm/jars/ records the same pom,
  pyspark and delta-spark as now; it re-resolves when any of them changes.
* A refused artifact stops it with one line naming the coordinates (the full Maven output stays in
  jvm/resolve.log), and the previous jar folder, if any, is left as it was.
* A resolved jar that pyspark already ships (same artifact name, or a class of the same name) stops it
  too: two copies of a class at different versions fail at run time, far from the cause.

`--parser` compiles jvm/parser/ (the envelope parser Spark runs, cdc_platform/parse/parse_spark.py) with
Maven into one jar: again a no-op while its manifest records the same pom, sources and pyspark; a compile
error stops it with the first error line (the whole output in jvm/parser/build.log).

Run with the project's venv (it reads pyspark's jar folder and the delta-spark version from it).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from xml.etree import ElementTree

from cdc_platform.spark.session import JARS_DIR, JARS_MANIFEST, OBJECT_STORE_JARS_DIR, PARSER_JARS_DIR

REPO = Path(__file__).resolve().parents[1]
POM = REPO / "jvm" / "pom.xml"
#: Hadoop's S3A filesystem, resolved apart (`--object-store`, `make setup-object-store`): see its pom.
OBJECT_STORE_POM = REPO / "jvm" / "object-store" / "pom.xml"
#: `cdc serve`'s JDBC login check, the one class the platform builds (`--serve-auth`): see its pom.
SERVE_AUTH_POM = REPO / "jvm" / "serve-auth" / "pom.xml"
LOG_NAME = "resolve.log"  # beside the pom: Maven's whole output of the last resolution
#: The envelope parser's module, built (not only resolved) by `--parser`.
PARSER_POM = REPO / "jvm" / "parser" / "pom.xml"
PARSER_LOG_NAME = "build.log"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# Every Spark module carries this placeholder class; it is no conflict.
SHARED_CLASS_PREFIXES = ("org/apache/spark/unused/",)
MVN_HELP = "install Maven 3.8+ (e.g. `sudo apt-get install -y maven` on Debian/Ubuntu, `brew install maven` on macOS)"


class SetupError(Exception):
    """A problem `make setup` reports as one line and stops on."""


def shown(path: Path) -> str:
    """A path as the user typed the command: relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def pom_properties(pom: Path) -> dict[str, str]:
    root = ElementTree.parse(pom).getroot()
    props = root.find("m:properties", POM_NS)
    if props is None:
        return {}
    return {child.tag.split("}", 1)[-1]: (child.text or "").strip() for child in props}


def check_versions(props: dict[str, str], pyspark_version: str, delta_version: str | None) -> None:
    """The pom names jars for one Spark line and one Delta release; the venv must have the same."""
    spark_binary = ".".join(pyspark_version.split(".")[:2])
    if props.get("spark.binary.version") != spark_binary:
        raise SetupError(f"jvm/pom.xml is for Spark {props.get('spark.binary.version')} but pyspark is {pyspark_version}: "
                         f"set spark.binary.version (and the Kafka connector's version) to {spark_binary}")
    if delta_version is None:
        raise SetupError("the delta-spark Python package is not installed in this venv: run `make setup`")
    if props.get("delta.version") != delta_version:
        raise SetupError(f"jvm/pom.xml resolves Delta {props.get('delta.version')} but the delta-spark Python package is "
                         f"{delta_version}: pin both to the same version (pyproject.toml and delta.version in the pom)")


def check_hadoop(props: dict[str, str], pyspark_jars: Path) -> None:
    """hadoop-aws must be the Hadoop of pyspark's hadoop-client-api: it is compiled against that hadoop-common."""
    shipped = sorted(p.name for p in pyspark_jars.glob("hadoop-client-api-*.jar"))
    version = shipped[0][len("hadoop-client-api-"):-len(".jar")] if shipped else None
    if version is None:
        raise SetupError(f"pyspark ships no hadoop-client-api jar in {pyspark_jars}; is pyspark installed in this venv? run `make setup`")
    if props.get("hadoop.version") != version:
        raise SetupError(f"jvm/object-store/pom.xml names Hadoop {props.get('hadoop.version')} but pyspark ships Hadoop {version}: "
                         f"set hadoop.version to {version}")


def fingerprint(pom: Path, pyspark_version: str, delta_version: str) -> dict[str, str]:
    return {"pom_sha256": hashlib.sha256(pom.read_bytes()).hexdigest(), "pyspark": pyspark_version, "delta_spark": delta_version}


def up_to_date(jars_dir: Path, wanted: dict[str, str]) -> bool:
    manifest = jars_dir / JARS_MANIFEST
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if any(doc.get(k) != v for k, v in wanted.items()):
        return False
    return all((jars_dir / jar["file"]).is_file() for jar in doc.get("jars", []))


_NOT_FOUND = re.compile(r"(?:Could not find artifact|Failure to find) (\S+) in (\S+ \(\S+\))")
_TRANSFER = re.compile(r"Could not transfer artifact (\S+) from/to (\S+ \(\S+\)): (.+?)(?: -> \[Help|$)")
_PLUGIN = re.compile(r"Plugin (\S+) or one of its dependencies could not be resolved: (.+?)(?: -> \[Help|$)")
_UNRESOLVED = re.compile(r"The following artifacts could not be resolved: (.+?): (?:Could not|Failure)")


def refusal_line(output: str) -> str:
    """One line naming what Maven refused, from its output (the ERROR lines name the coordinates)."""
    errors = [line[len("[ERROR] "):] for line in output.splitlines() if line.startswith("[ERROR] ")]
    text = "\n".join(errors)
    coords: list[str] = []
    for m in _UNRESOLVED.finditer(text):
        coords += [c.strip() for c in m.group(1).split(",")]
    for m in _NOT_FOUND.finditer(text):
        coords.append(m.group(1))
    coords = list(dict.fromkeys(coords))
    if coords:
        where = _NOT_FOUND.search(text)
        reason = f"not found in {where.group(2)}" if where else "not resolvable"
        return f"Maven refused {', '.join(coords)}: {reason}"
    m = _TRANSFER.search(text)
    if m:
        return f"Maven could not download {m.group(1)} from {m.group(2)}: {m.group(3).strip()}"
    m = _PLUGIN.search(text)
    if m:
        return f"Maven could not resolve its plugin {m.group(1)}: {m.group(2).strip()}"
    first = next((e for e in errors if e.strip()), None)
    return f"mvn failed: {first}" if first else "mvn failed without an [ERROR] line"


def parse_list(listing: str) -> list[dict[str, str]]:
    """`dependency:list` lines `group:artifact:type[:classifier]:version:scope:/abs/path.jar[ -- module …]`."""
    jars = []
    for raw in listing.splitlines():
        line = raw.split(" -- ", 1)[0].strip()
        if ":/" not in line:
            continue
        coords, path = line.split(":/", 1)
        parts = coords.split(":")
        if len(parts) < 5:
            continue
        group, artifact = parts[0], parts[1]
        version = parts[-2]
        classifier = parts[3] if len(parts) == 6 else None
        gav = f"{group}:{artifact}:{version}" + (f":{classifier}" if classifier else "")
        jars.append({"coordinates": gav, "file": Path("/" + path).name})
    return jars


def artifact_name(jar_file: str) -> str:
    """`jackson-core-2.21.2.jar` -> `jackson-core`: the name without version and classifier."""
    return re.sub(r"-\d[^-]*(?:-[A-Za-z][\w.-]*)?\.jar$", "", jar_file)


def shipped_conflicts(resolved: Path, jar_files: list[str], pyspark_jars: Path) -> list[str]:
    shipped = {p.name: p for p in pyspark_jars.glob("*.jar")}
    shipped_names = {artifact_name(n): n for n in shipped}
    problems = [f"{f} (pyspark ships {shipped_names[artifact_name(f)]})" for f in jar_files if artifact_name(f) in shipped_names]
    owner: dict[str, str] = {}
    for name, path in shipped.items():
        with zipfile.ZipFile(path) as z:
            for entry in z.namelist():
                if entry.endswith(".class"):
                    owner.setdefault(entry, name)
    for f in jar_files:
        with zipfile.ZipFile(resolved / f) as z:
            clash = next((e for e in z.namelist() if e.endswith(".class") and e in owner
                          and not e.startswith(SHARED_CLASS_PREFIXES) and not e.startswith("META-INF/")), None)
        if clash and not any(p.startswith(f + " ") for p in problems):
            problems.append(f"{f} (class {clash} is also in {owner[clash]})")
    return problems


def resolve(pom: Path, jars_dir: Path, wanted: dict[str, str], pyspark_jars: Path) -> list[dict[str, str]]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(f"no `mvn` found, needed to resolve the JVM artifacts in {shown(pom)}: {MVN_HELP}")
    staging = jars_dir.parent / (jars_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    listing = staging / "dependency-list.txt"
    cmd = [mvn, "-B", "-U", "-f", str(pom), "dependency:copy-dependencies", "dependency:list",
           "-DincludeScope=runtime", f"-DoutputDirectory={staging}", f"-DoutputFile={listing}",
           "-DoutputAbsoluteArtifactFilename=true"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = pom.parent / LOG_NAME
    log.write_text(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}", encoding="utf-8")
    if out.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise SetupError(f"{refusal_line(out.stdout + out.stderr)}; full output in {shown(log)}")
    jars = parse_list(listing.read_text(encoding="utf-8"))
    listing.unlink()
    copied = sorted(p.name for p in staging.glob("*.jar"))
    if not jars or sorted(j["file"] for j in jars) != copied:
        shutil.rmtree(staging, ignore_errors=True)
        raise SetupError(f"Maven's dependency list does not match the jars it copied ({copied}); see {shown(log)}")
    problems = shipped_conflicts(staging, copied, pyspark_jars)
    if problems:
        shutil.rmtree(staging, ignore_errors=True)
        raise SetupError(f"{shown(pom)} resolves jars pyspark already ships: {'; '.join(problems)}; exclude them in the pom")
    (staging / JARS_MANIFEST).write_text(json.dumps({**wanted, "jars": jars}, indent=2) + "\n", encoding="utf-8")
    swap_in(staging, jars_dir)
    return jars


def parser_fingerprint(pom: Path, pyspark_version: str) -> dict[str, str]:
    """What the built parser jar depends on: its pom and every file under src/ (names and bytes), and pyspark."""
    digest = hashlib.sha256(pom.read_bytes())
    for path in sorted(p for p in (pom.parent / "src").rglob("*") if p.is_file()):
        digest.update(b"\0" + str(path.relative_to(pom.parent)).encode("utf-8") + b"\0" + path.read_bytes())
    return {"sources_sha256": digest.hexdigest(), "pyspark": pyspark_version}


def compile_error_line(output: str) -> str | None:
    """The first compiler message of a failed build (`[ERROR] /path/File.java:[line,col] message`), shortened."""
    for line in output.splitlines():
        m = re.match(r"\[ERROR\] (\S+\.java):\[(\d+),\d+\] (.+)", line)
        if m:
            return f"{shown(Path(m.group(1)))}:{m.group(2)}: {m.group(3).strip()}"
    return None


def swap_in(staging: Path, jars_dir: Path) -> None:
    """Put the complete `staging` folder in place of `jars_dir`: a failed run never leaves a half-filled
    folder that looks ready."""
    old = jars_dir.parent / (jars_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if jars_dir.exists():
        jars_dir.rename(old)
    staging.rename(jars_dir)
    shutil.rmtree(old, ignore_errors=True)


def build_parser(pom: Path, jars_dir: Path, wanted: dict[str, str]) -> list[dict[str, str]]:
    """`mvn package` of jvm/parser/, its jar copied into `jars_dir` with a manifest (swapped in whole, as `resolve`)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(f"no `mvn` found, needed to build the envelope parser in {shown(pom.parent)}: {MVN_HELP}")
    cmd = [mvn, "-B", "-f", str(pom), "-DskipTests", "package"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = pom.parent / PARSER_LOG_NAME
    log.write_text(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}", encoding="utf-8")
    if out.returncode != 0:
        text = out.stdout + out.stderr
        compile_error = compile_error_line(text)
        what = f"compiling {shown(pom.parent)} failed: {compile_error}" if compile_error else refusal_line(text)
        raise SetupError(f"{what}; full output in {shown(log)}")
    props = pom_properties(pom)
    root = ElementTree.parse(pom).getroot()
    artifact = root.findtext("m:artifactId", namespaces=POM_NS)
    version = root.findtext("m:version", namespaces=POM_NS)
    group = root.findtext("m:groupId", namespaces=POM_NS)
    built = pom.parent / "target" / f"{artifact}-{version}.jar"
    if not built.is_file():
        raise SetupError(f"mvn reported success but built no {shown(built)}; see {shown(log)}")
    staging = jars_dir.parent / (jars_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copyfile(built, staging / built.name)
    jars = [{"coordinates": f"{group}:{artifact}:{version}", "file": built.name}]
    (staging / JARS_MANIFEST).write_text(json.dumps({**wanted, "spark_binary": props.get("spark.binary.version"), "jars": jars}, indent=2) + "\n",
                                         encoding="utf-8")
    swap_in(staging, jars_dir)
    return jars


def check_parser_spark(props: dict[str, str], pyspark_version: str) -> None:
    spark_binary = ".".join(pyspark_version.split(".")[:2])
    if props.get("spark.binary.version") != spark_binary:
        raise SetupError(f"jvm/parser/pom.xml compiles against Spark {props.get('spark.binary.version')} but pyspark is {pyspark_version}: "
                         f"set spark.binary.version and spark.compile.version there to a served {spark_binary}.x")


def main_parser() -> int:
    import pyspark

    try:
        check_parser_spark(pom_properties(PARSER_POM), pyspark.__version__)
        wanted = parser_fingerprint(PARSER_POM, pyspark.__version__)
        if up_to_date(PARSER_JARS_DIR, wanted):
            return 0
        start = time.monotonic()
        print(f"building {shown(PARSER_POM.parent)} with mvn into {shown(PARSER_JARS_DIR)}/ ...", file=sys.stderr)
        jars = build_parser(PARSER_POM, PARSER_JARS_DIR, wanted)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{jars[0]['file']} in {shown(PARSER_JARS_DIR)}/ ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


def build_serve_auth(pyspark_jars: Path) -> Path:
    """Compile jvm/serve-auth against pyspark's own jars into its target/cdc-serve-auth.jar (Maven's
    compiler and jar plugins are all it downloads, once)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(f"no `mvn` found, needed to build {shown(SERVE_AUTH_POM.parent)}: {MVN_HELP}")
    jars = {}
    for prop, pattern in (("thriftserver.jar", "spark-hive-thriftserver_*.jar"), ("slf4j.jar", "slf4j-api-*.jar")):
        found = sorted(pyspark_jars.glob(pattern))
        if not found:
            raise SetupError(f"pyspark ships no {pattern} in {pyspark_jars}; is pyspark installed in this venv? run `make setup`")
        jars[prop] = found[0]
    cmd = [mvn, "-B", "-f", str(SERVE_AUTH_POM), *(f"-D{k}={v}" for k, v in jars.items()), "clean", "package"]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    log = SERVE_AUTH_POM.parent / "build.log"
    log.write_text(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}", encoding="utf-8")
    jar = SERVE_AUTH_POM.parent / "target" / "cdc-serve-auth.jar"
    if out.returncode != 0 or not jar.is_file():
        raise SetupError(f"{refusal_line(out.stdout + out.stderr)}; full output in {shown(log)}")
    return jar


def main(argv: list[str] | None = None) -> int:
    import pyspark

    args = sys.argv[1:] if argv is None else argv
    if "--parser" in args:
        return main_parser()
    if "--serve-auth" in args:
        try:
            start = time.monotonic()
            print(f"building {shown(SERVE_AUTH_POM.parent)} with mvn ...", file=sys.stderr)
            jar = build_serve_auth(Path(pyspark.__file__).parent / "jars")
        except SetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{shown(jar)} ({time.monotonic() - start:.0f} s)", file=sys.stderr)
        return 0
    object_store = "--object-store" in args
    pom, jars_dir = (OBJECT_STORE_POM, OBJECT_STORE_JARS_DIR) if object_store else (POM, JARS_DIR)
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    try:
        delta_version: str | None = metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        delta_version = None
    try:
        props = pom_properties(pom)
        if object_store:
            check_hadoop(props, pyspark_jars)
        else:
            check_versions(props, pyspark.__version__, delta_version)
        wanted = fingerprint(pom, pyspark.__version__, delta_version or "")
        if up_to_date(jars_dir, wanted):
            return 0
        start = time.monotonic()
        print(f"resolving {shown(pom)} with mvn into {shown(jars_dir)}/ ...", file=sys.stderr)
        jars = resolve(pom, jars_dir, wanted, pyspark_jars)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(jars)} jars in {shown(jars_dir)}/ ({time.monotonic() - start:.0f} s): "
          + ", ".join(j["coordinates"] for j in jars), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
