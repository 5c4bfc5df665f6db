# The two commands a user needs: `make demo` and `make test` (each runs `setup` first).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The JVM jars Spark loads beside pyspark's (jvm/pom.xml), resolved by mvn; the manifest is the stamp.
JARS_STAMP := jvm/jars/manifest.json
# The envelope parser (jvm/parser/), compiled by mvn; its manifest is the stamp. Its sources' folders are
# prerequisites too, so that a deleted source rebuilds it; the script rebuilds only when their bytes changed.
PARSER_STAMP := jvm/parser/jars/manifest.json
PARSER_SOURCES := $(shell find jvm/parser/src)
# `cdc serve`'s JDBC login check (jvm/serve-auth), compiled against pyspark's jars by mvn.
SERVE_AUTH_JAR := jvm/serve-auth/target/cdc-serve-auth.jar
# The driver JVM's class-data archive (cdc_platform/spark/class_archive.py): one training run, remade when the jars,
# the venv or the script change; its stamp is made even when this Java writes no archive (sessions then start without).
CLASS_ARCHIVE_STAMP := jvm/class-archive/stamp
# Hadoop's S3A jars (jvm/object-store/pom.xml), for a lake on an object store; apart because of their size.
OBJECT_STORE_STAMP := jvm/object-store/jars/manifest.json

.PHONY: setup setup-object-store demo test ui serve clean check-java testbed stack stack-status stack-stop

check-java:
	@$(PYTHON) scripts/check_java.py

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[dev,connect]'
	@touch $(STAMP)

# Re-resolves only when the pom, the script or the venv changed (and then only if pom, pyspark or
# delta-spark differ from the manifest's); once done it is offline.
$(JARS_STAMP): jvm/pom.xml scripts/resolve_jars.py $(STAMP)
	@$(BIN)/python scripts/resolve_jars.py
	@touch $@

$(PARSER_STAMP): jvm/parser/pom.xml $(PARSER_SOURCES) scripts/resolve_jars.py $(STAMP)
	@$(BIN)/python scripts/resolve_jars.py --parser
	@touch $@

$(SERVE_AUTH_JAR): jvm/serve-auth/pom.xml $(wildcard jvm/serve-auth/src/main/java/cdcplatform/serve/*.java) scripts/resolve_jars.py $(STAMP)
	@$(BIN)/python scripts/resolve_jars.py --serve-auth

$(CLASS_ARCHIVE_STAMP): $(JARS_STAMP) $(PARSER_STAMP) scripts/build_class_archive.py cdc_platform/spark/class_archive.py $(STAMP)
	@$(BIN)/python scripts/build_class_archive.py
	@touch $@

setup: check-java $(STAMP) $(JARS_STAMP) $(PARSER_STAMP) $(SERVE_AUTH_JAR) $(CLASS_ARCHIVE_STAMP)

$(OBJECT_STORE_STAMP): jvm/object-store/pom.xml scripts/resolve_jars.py $(STAMP)
	@$(BIN)/python scripts/resolve_jars.py --object-store
	@touch $@

# Only for a lake on S3 or an S3-compatible store (641 MB of AWS SDK); `make test` needs it for its S3 test.
setup-object-store: setup $(OBJECT_STORE_STAMP)

demo: setup
	@$(BIN)/cdc demo
	@PYTHONWARNINGS=ignore $(BIN)/python -m dagster_project.record --config .cdc-demo/cdc.yaml --home .dagster_home

test: setup setup-object-store
	@$(BIN)/python -m pytest -q --durations=30 -n 2 --dist loadgroup

ui: setup
	@mkdir -p .dagster_home && cp dagster_project/dagster.yaml .dagster_home/dagster.yaml
	@test -f .cdc-demo/cdc.yaml || $(BIN)/cdc generate --out .cdc-demo
	@DAGSTER_HOME=$(CURDIR)/.dagster_home $(BIN)/dagster dev -w workspace.yaml

# One Spark serving the demo's lake: Spark Connect on 127.0.0.1:15002, JDBC on 127.0.0.1:10000 (README "Serving SQL").
serve: setup
	@test -f .cdc-demo/lake/_cdc_registry.json || $(BIN)/cdc demo
	@$(BIN)/cdc serve --config .cdc-demo/cdc.yaml

# The test bed (Kafka, Kafka Connect + Debezium, PostgreSQL, MariaDB on loopback; README "Test bed").
# `testbed` resolves jvm/testbed with mvn and apt-installs the database servers when missing; the tests'
# fixture does the same on first use. State of a user's stack: .stack/ (gitignored).
testbed: setup
	@$(BIN)/python -m cdc_platform.testbed install

stack: testbed
	@$(BIN)/python -m cdc_platform.testbed start

stack-status:
	@$(BIN)/python -m cdc_platform.testbed status

stack-stop:
	@$(BIN)/python -m cdc_platform.testbed stop

clean:
	rm -rf .cdc-demo .dagster_home .pytest_cache
