"""The UI a person opens: the webserver serves the sample project's asset graph and checks over GraphQL."""

from __future__ import annotations

from pathlib import Path

from cdc_platform.workload.generate import generate_workload
from dagster_project.webserver import graphql, serve

ASSET_GRAPH = """
{ assetNodes { assetKey { path } groupName dependencyKeys { path }
    assetChecksOrError { __typename ... on AssetChecks { checks { name } } } } }
"""


def test_webserver_serves_the_asset_graph_and_checks(tmp_path: Path) -> None:
    workload = generate_workload(tmp_path / "sample", transactions=20)
    with serve(workload.config_path) as url:
        nodes = graphql(url, ASSET_GRAPH)["assetNodes"]
    by_name = {n["assetKey"]["path"][-1]: n for n in nodes}
    for table in ("customers", "charges", "refunds"):
        assert by_name[table]["groupName"] == "latest_state"
        assert {"path": ["raw_change_events"]} in by_name[table]["dependencyKeys"]
        assert by_name[f"{table}__full_view"]["groupName"] == "views"
        assert {"path": [table]} in by_name[f"{table}__clean_view"]["dependencyKeys"]
    assert by_name["raw_change_events"]["groupName"] == "ingest"
    assert by_name["transactions"]["groupName"] == "transactions"
    checks = {name: {c["name"] for c in n["assetChecksOrError"].get("checks", [])} for name, n in by_name.items()}
    assert {"freshness", "great_expectations"} <= checks["raw_change_events"]
    assert "new_dead_letters" in checks["dead_letter"]
    assert "great_expectations" in checks["customers"]
