"""scripts/resolve_jars.py: Maven's refusals become one line naming the coordinates; the listing and the
pyspark-overlap check read what Maven and pyspark really write. (Resolution itself runs in `make setup`.)"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rj() -> ModuleType:
    spec = importlib.util.spec_from_file_location("resolve_jars", REPO / "scripts" / "resolve_jars.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Maven 3.8.7's output on this machine, for a pom naming versions Maven Central does not serve here.
REFUSED = """\
[WARNING] The POM for io.delta:delta-spark_4.1_2.13:jar:4.4.1 is missing, no dependency information available
[WARNING] The POM for org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.1.4 is missing, no dependency information available
[ERROR] Failed to execute goal on project cdc-platform-jvm: Could not resolve dependencies for project cdc-platform:cdc-platform-jvm:pom:0.1.0: The following artifacts could not be resolved: io.delta:delta-spark_4.1_2.13:jar:4.4.1, org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.1.4: Could not find artifact io.delta:delta-spark_4.1_2.13:jar:4.4.1 in central (https://repo.maven.apache.org/maven2) -> [Help 1]
[ERROR] 
[ERROR] To see the full stack trace of the errors, re-run Maven with the -e switch.
"""
REFUSED_ONE = """\
[ERROR] Failed to execute goal on project cdc-platform-jvm: Could not resolve dependencies for project cdc-platform:cdc-platform-jvm:pom:0.1.0: Could not find artifact org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.1.4 in central (https://repo.maven.apache.org/maven2) -> [Help 1]
"""


def test_refusal_names_every_refused_coordinate_on_one_line(rj: ModuleType) -> None:
    line = rj.refusal_line(REFUSED)
    assert line == ("Maven refused io.delta:delta-spark_4.1_2.13:jar:4.4.1, org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.1.4: "
                    "not found in central (https://repo.maven.apache.org/maven2)")
    assert rj.refusal_line(REFUSED_ONE) == (
        "Maven refused org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.1.4: not found in central (https://repo.maven.apache.org/maven2)")
    assert rj.refusal_line("[ERROR] something else entirely\n") == "mvn failed: something else entirely"


def test_listing_and_names(rj: ModuleType) -> None:
    listing = """
The following files have been resolved:
   io.delta:delta-spark_4.1_2.13:jar:4.4.0:compile:/m2/io/delta/delta-spark_4.1_2.13/4.4.0/delta-spark_4.1_2.13-4.4.0.jar
   org.apache.kafka:kafka-clients:jar:3.9.1:compile:/m2/org/apache/kafka/kafka-clients/3.9.1/kafka-clients-3.9.1.jar -- module kafka.clients (auto)
"""
    assert rj.parse_list(listing) == [
        {"coordinates": "io.delta:delta-spark_4.1_2.13:4.4.0", "file": "delta-spark_4.1_2.13-4.4.0.jar"},
        {"coordinates": "org.apache.kafka:kafka-clients:3.9.1", "file": "kafka-clients-3.9.1.jar"},
    ]
    assert rj.artifact_name("jackson-core-2.21.2.jar") == "jackson-core"
    assert rj.artifact_name("spark-sql-kafka-0-10_2.13-4.1.1.jar") == "spark-sql-kafka-0-10_2.13"
    assert rj.artifact_name("orc-core-2.2.2-shaded-protobuf.jar") == "orc-core"
    assert rj.artifact_name("netty-transport-native-epoll-4.2.7.Final-linux-x86_64.jar") == "netty-transport-native-epoll"


def test_a_jar_pyspark_already_ships_is_refused(rj: ModuleType, tmp_path: Path) -> None:
    shipped, resolved = tmp_path / "pyspark-jars", tmp_path / "resolved"
    shipped.mkdir()
    resolved.mkdir()
    for folder, name, cls in [(shipped, "jackson-core-2.21.2.jar", "com/fasterxml/jackson/core/JsonParser.class"),
                              (shipped, "spark-sql_2.13-4.1.4.jar", "org/apache/spark/unused/UnusedStubClass.class"),
                              (resolved, "jackson-core-2.13.5.jar", "com/fasterxml/jackson/core/JsonParser.class"),
                              (resolved, "shaded-thing-1.0.jar", "com/fasterxml/jackson/core/JsonParser.class"),
                              (resolved, "spark-sql-kafka-0-10_2.13-4.1.1.jar", "org/apache/spark/unused/UnusedStubClass.class")]:
        with zipfile.ZipFile(folder / name, "w") as z:
            z.writestr(cls, b"")
    problems = rj.shipped_conflicts(resolved, sorted(p.name for p in resolved.iterdir()), shipped)
    assert problems == ["jackson-core-2.13.5.jar (pyspark ships jackson-core-2.21.2.jar)",
                        "shaded-thing-1.0.jar (class com/fasterxml/jackson/core/JsonParser.class is also in jackson-core-2.21.2.jar)"]


def test_the_object_store_pom_must_name_the_hadoop_of_pyspark(rj: ModuleType, tmp_path: Path) -> None:
    """hadoop-aws is compiled against one hadoop-common: pyspark's (hadoop-client-api), or S3A fails at run time."""
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    props = rj.pom_properties(rj.OBJECT_STORE_POM)
    rj.check_hadoop(props, shipped)  # the pom in the repository agrees with the pyspark installed
    with pytest.raises(rj.SetupError, match=r"names Hadoop 3\.3\.6 but pyspark ships Hadoop 3\.\d+\.\d+: set hadoop.version"):
        rj.check_hadoop({**props, "hadoop.version": "3.3.6"}, shipped)
    with pytest.raises(rj.SetupError, match="ships no hadoop-client-api jar"):
        rj.check_hadoop(props, tmp_path)


def test_the_parser_rebuilds_only_when_its_pom_or_sources_change(rj: ModuleType, tmp_path: Path) -> None:
    """`make setup` runs `--parser` whenever make thinks a source is newer; the fingerprint decides whether mvn runs."""
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    source = tmp_path / "src" / "main" / "java" / "A.java"
    source.parent.mkdir(parents=True)
    source.write_text("class A {}")
    first = rj.parser_fingerprint(pom, "4.1.4")
    assert rj.parser_fingerprint(pom, "4.1.4") == first
    source.touch()  # a newer time, the same bytes: no rebuild
    assert rj.parser_fingerprint(pom, "4.1.4") == first
    source.write_text("class A { }")
    changed = rj.parser_fingerprint(pom, "4.1.4")
    assert changed != first
    (source.parent / "B.java").write_text("class B {}")
    assert rj.parser_fingerprint(pom, "4.1.4") != changed
    assert rj.parser_fingerprint(pom, "4.1.5")["pyspark"] == "4.1.5"
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "p.jar").write_bytes(b"")
    (jars / "manifest.json").write_text(json.dumps({**first, "jars": [{"coordinates": "g:p:1", "file": "p.jar"}]}))
    assert rj.up_to_date(jars, first) and not rj.up_to_date(jars, changed)


def test_a_compile_error_is_one_line_naming_the_file(rj: ModuleType) -> None:
    output = f"""[INFO] Compiling 12 source files with javac [debug release 17] to target/classes
[ERROR] COMPILATION ERROR :
[ERROR] {REPO}/jvm/parser/src/main/java/cdc/platform/parse/Envelope.java:[42,9] cannot find symbol
  symbol:   variable nope
[ERROR] Failed to execute goal org.apache.maven.plugins:maven-compiler-plugin:3.13.0:compile (default-compile)
"""
    assert rj.compile_error_line(output) == "jvm/parser/src/main/java/cdc/platform/parse/Envelope.java:42: cannot find symbol"
    assert rj.compile_error_line("[ERROR] something else\n") is None


def test_the_parser_pom_is_for_pyspark_s_spark(rj: ModuleType) -> None:
    import pyspark

    rj.check_parser_spark(rj.pom_properties(rj.PARSER_POM), pyspark.__version__)
    with pytest.raises(rj.SetupError, match=r"compiles against Spark 4\.1 but pyspark is 4\.2\.0"):
        rj.check_parser_spark({"spark.binary.version": "4.1"}, "4.2.0")
