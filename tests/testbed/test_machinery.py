"""The test bed's machinery without the bed: ports, process groups, health waits, the parent-death
signal, and the one-line errors of the install step. Fast: no JVM, no database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.process import Service, free_ports, group_alive, stop_group


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _dead(pid):
            return True
        time.sleep(0.05)
    return False


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def test_free_ports_are_distinct_loopback_ports() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # still free


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    svc = Service("sleepers", tmp_path / "sleepers.log")
    svc.launch(["bash", "-c", "sleep 300 & sleep 300 & wait"])
    deadline = time.monotonic() + 5
    while len(_group_members(svc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = _group_members(svc.pid)
    assert len(members) == 3, "bash and its two sleeps share the group"
    svc.stop(timeout=5)
    assert all(_wait_dead(pid) for pid in members)
    assert not group_alive(svc.pid)


def test_stop_kills_what_ignores_the_polite_signal(tmp_path: Path) -> None:
    svc = Service("stubborn", tmp_path / "stubborn.log")
    svc.launch(["bash", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"])
    time.sleep(0.3)
    t = time.monotonic()
    svc.stop(timeout=1)
    assert time.monotonic() - t < 8
    assert not svc.alive()


def test_a_service_that_dies_while_starting_fails_with_one_line(tmp_path: Path) -> None:
    svc = Service("flaky server", tmp_path / "flaky.log")
    svc.launch(["sh", "-c", "echo starting; echo 'FATAL: address already in use'; exit 3"])
    with pytest.raises(TestbedError) as err:
        svc.wait_until(lambda: False, "waiting for its port", timeout=10)
    message = str(err.value)
    assert "\n" not in message
    assert "flaky server exited with code 3" in message and "address already in use" in message and str(svc.log) in message


def test_a_service_that_never_answers_times_out_with_one_line(tmp_path: Path) -> None:
    svc = Service("mute server", tmp_path / "mute.log")
    svc.launch(["sleep", "300"])
    try:
        with pytest.raises(TestbedError) as err:
            svc.wait_until(lambda: 1 / 0, "waiting for a reply", timeout=0.5)
        assert "\n" not in str(err.value) and "not ready after" in str(err.value) and "ZeroDivisionError" in str(err.value)
    finally:
        svc.stop()


# As root the databases run as their packages' users: the signal must survive that switch of user too.
@pytest.mark.parametrize("user", [None, "nobody"] if os.geteuid() == 0 else [None])
def test_servers_die_with_the_process_that_started_them(tmp_path: Path, user: str | None) -> None:
    """A test run killed with SIGKILL cannot run its teardown: the kernel's parent-death signal stops
    its servers all the same."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from cdc_platform.testbed.process import Service\n"
        f"s = Service('orphan', Path({str(tmp_path / 'orphan.log')!r}))\n"
        f"s.launch(['sleep', '300'], user={user!r})\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not _dead(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_dead(child), "the server outlived the process that started it"


def test_stop_group_of_a_gone_group_is_a_no_op() -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    stop_group(proc.pid, timeout=0.5)


# -- install: one line when something cannot be had ----------------------------------------------------------
@pytest.fixture
def scratch_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the install step's output at a scratch folder (the real jars stay untouched)."""
    target = tmp_path / "target"
    monkeypatch.setattr(install, "TARGET", target)
    monkeypatch.setattr(install, "KAFKA_LIBS", target / "kafka-libs")
    monkeypatch.setattr(install, "PLUGINS", target / "plugins")
    monkeypatch.setattr(install, "STAMP", target / ".resolved")
    monkeypatch.setattr(install, "MVN_LOG", target / "mvn.log")
    monkeypatch.setattr(install, "APT_LOG", target / "apt.log")
    monkeypatch.setattr(install, "REGISTRY_DIST", target / "apicurio-registry-dist")
    monkeypatch.setattr(install, "REGISTRY_HOME", target / "apicurio-registry")
    monkeypatch.setattr(install, "CONVERTER_MANIFEST", target / "plugins" / "apicurio-converter" / "manifest.jar")
    return target


def fake_program(scratch_target: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> Path:
    """A shell script named `name`, first on PATH for the test."""
    bin_dir = scratch_target.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / name
    fake.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return fake


def test_without_maven_the_install_says_so_in_one_line(scratch_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(scratch_target.parent / "empty"))
    with pytest.raises(TestbedError, match=r"^test bed: Maven \(`mvn`\) is not on PATH; install it") as err:
        install.ensure_jars()
    assert "\n" not in str(err.value)


def test_a_refused_artifact_names_mavens_error_line(scratch_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_program(scratch_target, monkeypatch, "mvn",
                 "echo '[INFO] Scanning for projects...'\n"
                 "echo '[ERROR] Failed to execute goal on project kafka: Could not find artifact org.apache.kafka:kafka_2.13:jar:9.9.9 in central'\n"
                 "echo '[ERROR] '\n"
                 "exit 1\n")
    with pytest.raises(TestbedError) as err:
        install.ensure_jars()
    message = str(err.value)
    assert "\n" not in message
    assert "Could not find artifact org.apache.kafka:kafka_2.13:jar:9.9.9" in message and "mvn.log" in message


def test_missing_servers_without_root_say_what_to_install(scratch_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "_locate", lambda: {"java": "/usr/bin/java", "initdb": None, "postgres": None, "mariadb_install_db": None, "mariadbd": None})
    monkeypatch.setattr(install.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match=r"^test bed: PostgreSQL/MariaDB servers not installed; run: sudo apt-get install -y postgresql mariadb-server$"):
        install.ensure_programs()


def test_apt_waits_for_another_apt_holding_its_lock_then_installs(scratch_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installers at once (two pytest-xdist workers, say): the second `apt-get update` found the list
    lock held and failed at once (CI replica, 2026-11-26); now it waits for the lock and goes on."""
    calls = scratch_target.parent / "calls"
    fake_program(scratch_target, monkeypatch, "apt-get",
                 f"echo \"$*\" >> {calls}\n"
                 f"if [ \"$(grep -c update {calls})\" = 1 ]; then\n"
                 "  echo 'E: Could not get lock /var/lib/apt/lists/lock. It is held by process 3079 (apt-get)'; exit 100\n"
                 "fi\n"
                 "exit 0\n")
    monkeypatch.setattr(install.os, "geteuid", lambda: 0)
    monkeypatch.setattr(install.time, "sleep", lambda _s: None)
    install._apt_install(("postgresql",))
    lines = calls.read_text(encoding="utf-8").splitlines()
    assert [line.split()[2] for line in lines] == ["update", "update", "install"]


def test_apt_failing_for_another_reason_fails_at_once_in_one_line(scratch_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_program(scratch_target, monkeypatch, "apt-get", "echo 'E: Unable to locate package postgresql'\nexit 100\n")
    monkeypatch.setattr(install.os, "geteuid", lambda: 0)
    with pytest.raises(TestbedError, match=r"^test bed: `apt-get .* update -q` failed: E: Unable to locate package postgresql"):
        install._apt_install(("postgresql",))
    assert (scratch_target / "apt.log").read_text(encoding="utf-8").count("$ apt-get") == 1


def test_jars_are_current_only_for_the_poms_they_were_resolved_from(scratch_target: Path) -> None:
    (scratch_target / "kafka-libs").mkdir(parents=True)
    (scratch_target / "kafka-libs" / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    for name in install.PLUGIN_NAMES:
        (scratch_target / "plugins" / name).mkdir(parents=True)
        (scratch_target / "plugins" / name / "x.jar").write_bytes(b"")
    (scratch_target / "apicurio-registry" / "lib").mkdir(parents=True)
    (scratch_target / "apicurio-registry" / "apicurio-registry-app-2.6.13.Final-runner.jar").write_bytes(b"")
    install._write_converter_manifest()
    assert not install.jars_ready(), "no stamp"
    install.STAMP.write_text("some other pom hash\n", encoding="utf-8")
    assert not install.jars_ready(), "a stamp of other poms"
    install.STAMP.write_text(install._poms_hash() + "\n", encoding="utf-8")
    assert install.jars_ready()
    install.CONVERTER_MANIFEST.unlink()
    assert not install.jars_ready(), "the converter plugin without its ServiceLoader manifest"


def test_the_converter_manifest_names_apicurios_avro_converter(scratch_target: Path) -> None:
    import zipfile

    install.CONVERTER_MANIFEST.parent.mkdir(parents=True)
    install._write_converter_manifest()
    with zipfile.ZipFile(install.CONVERTER_MANIFEST) as jar:
        listed = jar.read("META-INF/services/org.apache.kafka.connect.storage.Converter").decode().split()
    assert listed == ["io.apicurio.registry.utils.converter.AvroConverter"]


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage tool read `-t -T05A...` as two options and the broker's format failed."""
    import uuid

    from cdc_platform.testbed import kafka

    draws = iter([uuid.UUID(bytes=b"\xf9" + bytes(15)), uuid.UUID(int=5)])  # the first encodes to "-Q...", a leading dash
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    assert kafka.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAABQ"


def test_the_stack_files_name_the_registry_and_the_avro_converter(tmp_path: Path) -> None:
    """`make stack` writes CDC_SCHEMA_REGISTRY_URL into .stack/env and the converter settings beside it."""
    import json

    from cdc_platform.testbed.__main__ import AVRO_CONVERTER_FILE, _write_env
    from cdc_platform.testbed.registry import Registry

    registry = Registry(tmp_path / "registry", 18081)
    state = {"endpoints": {"kafka": "127.0.0.1:1", "connect": "http://127.0.0.1:2", "postgres": "postgresql://x", "mariadb": "mysql://y",
                           "schema_registry": registry.url},
             "ports": {"postgres": 3, "mariadb": 4}, "avro_converter": registry.avro_converter_config()}
    _write_env(state, tmp_path)
    assert "export CDC_SCHEMA_REGISTRY_URL=http://127.0.0.1:18081/apis/ccompat/v7\n" in (tmp_path / "env").read_text(encoding="utf-8")
    converter = json.loads((tmp_path / AVRO_CONVERTER_FILE).read_text(encoding="utf-8"))
    assert converter["value.converter"] == converter["key.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
    assert converter["value.converter.apicurio.registry.url"] == "http://127.0.0.1:18081/apis/registry/v2"
    assert converter["value.converter.apicurio.registry.as-confluent"] == "true"
    assert converter["key.converter.apicurio.registry.headers.enabled"] == "false"
