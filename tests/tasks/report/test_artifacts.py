"""The report's tables as Prefect artifacts: narrow enough for Prefect's artifact view, read back from a real Prefect API."""

from tasks.report.task import ARTIFACT_COLUMNS, narrow_tables, publish_artifacts

WIDE = [{"run": f"r{i}", "setting": ("x",), "workload": "digits", "framework": "torch", "empty": None, **{f"c{j}": i * j + 0.5 for j in range(17)}}
        for i in range(3)]


def test_a_wide_table_becomes_narrow_parts_joined_by_the_run_and_empty_columns_go():
    parts = narrow_tables(WIDE, width=8)
    assert [len(p[0]) for p in parts] == [8, 8, 6]  # run + 7, run + 7, run + 5 of the 19 other columns that hold a value
    assert all(list(p[0])[0] == "run" and [row["run"] for row in p] == ["r0", "r1", "r2"] for p in parts)
    shown = [c for p in parts for c in list(p[0])[1:]]
    assert shown == ["workload", "framework", *(f"c{j}" for j in range(17))]  # in order, once each; "empty" and "setting" left out
    assert parts[2][1]["c16"] == "16.5"  # formatted as the report formats its cells
    assert narrow_tables([]) == [] and narrow_tables(WIDE[:1], width=40)[0][0]["c3"] == "0.5"


def test_the_published_tables_fit_the_artifact_view(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    @flow
    def publish():
        publish_artifacts({"name": "Wide Report", "markdown": "# report", "train_rows": WIDE, "infer_rows": []})

    publish()

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="wide-report-")))

    import asyncio
    import json

    tables = {a.key: json.loads(a.data) if isinstance(a.data, str) else a.data for a in asyncio.run(read()) if a.type == "table"}
    assert {"wide-report-training", "wide-report-training-2", "wide-report-training-3", "wide-report-inference"} <= set(tables)
    for key, table in tables.items():
        assert len(table[0]) <= ARTIFACT_COLUMNS, key
    assert tables["wide-report-inference"] == [{"status": "no rollouts"}]
