"""The cluster page explains itself and the metrics reach Prometheus, from a real
``projections run --admin-port`` process with ``plugins: [projections_otel]`` (SQLite and
MariaDB): the serving member is marked by its id; each consumer says whether it is
applied there and why not, carries its health verdict as a badge and a lag chart
(rendered by headless Chromium, screenshot kept); ``GET /metrics``, parsed as the
Prometheus exposition format, has the ownership gauges, the partitioned fetches and the
health state set, each with its tenant. ``projections admin`` then answers as a
non-member, with no live member, saying so."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import page_app
import prometheus_client.parser as parser
import pytest
from admin_client import admin_process, chromium, get, get_json, screenshot
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from freezing import freeze
from health_app import free_port
from sqlalchemy import MetaData

from messaging import Database
from messaging._config import load_settings
from messaging._states import Verdict
from projections._admin import NO_METRICS
from projections._health import health_report

pytestmark = pytest.mark.multiprocess

TENANT = "acme"
EXPECTED = {
    page_app.HEALTHY: Verdict.CAUGHT_UP,
    page_app.STALLED: Verdict.STALLED,
    page_app.HALTED: Verdict.HALTED,
}


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return []


def _config(tmp_path: Path, db: Database, *, plugin: bool = True) -> Path:
    extra = f"tenant: {TENANT}\nhealth:\n  stall-timeout: 1s\n"  # (a frozen member: live 60 s)
    extra += "plugins: [projections_otel]\n" if plugin else ""
    timing = {"stale-instance-timeout": "60s"}
    return write_config(tmp_path / "config.yaml", db, extra=extra, consumer=timing)


def _metrics(base: str) -> dict[str, list[Any]]:
    """``GET /metrics`` parsed: each sample's name → its samples."""
    status, content_type, body = get(base + "/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, body)
    samples: dict[str, list[Any]] = {}
    for family in parser.text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


@pytest.fixture
def running(db: Database, tmp_path: Path) -> Iterator[tuple[str, Database]]:
    """(base URL, db): instance ``page-1`` runs ``page_app`` (a healthy and a halted
    consumer) and serves its admin port; ``page-2`` runs ``page_stalled_app`` and is
    frozen with messages to apply (stalled; live for a minute more)."""
    config = _config(tmp_path, db)
    settings = load_settings(config, environ={})
    port = free_port()
    tenant_db = Database(db.url, table_prefix=db.schema.prefix, tenant=TENANT)
    frozen = start_instance(config, "page-2", "page_stalled_app", log=tmp_path / "page-2.log")
    process = None
    try:
        wait_until(
            lambda: owned_by(tenant_db, {"page-2"}, page_app.STALLED),
            timeout=60,
            what="page-2 to own page-stalled",
        )
        freeze(frozen, tenant_db)
        process = start_instance(
            config,
            "page-1",
            "page_app",
            log=tmp_path / "page-1.log",
            options=("--admin-port", str(port)),
        )
        wait_until(lambda: len(_verdicts(tenant_db, settings)) == 3, timeout=60, what="page-1")
        page_app.append(tenant_db, 0, 20)

        def verdicts() -> bool:
            return _verdicts(tenant_db, settings) == EXPECTED

        wait_until(verdicts, timeout=60, what="a healthy, a stalled and a halted consumer")
        yield f"http://127.0.0.1:{port}", tenant_db
    finally:
        frozen.send_signal(signal.SIGCONT)
        for name, started in (("page-1", process), ("page-2", frozen)):
            if started is not None:
                assert stop_instance(started) == 0, (tmp_path / f"{name}.log").read_text()
        tenant_db.dispose()


def _verdicts(db: Database, settings: Any) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in health_report(db, settings)["consumers"]}


def test_the_page_and_the_metrics_explain_the_cluster(
    running: tuple[str, Database], tmp_path: Path
) -> None:
    base, db = running
    status, cluster = get_json(base + "/admin/cluster")
    assert status == 200
    serving = cluster["serving"]
    assert serving["member"] is True and serving["name"] == "page-1"
    members = {m["name"]: m for m in cluster["members"]}
    assert members["page-1"]["serving"] is True and members["page-2"]["serving"] is False
    assert members["page-1"]["id"] == serving["id"]
    here = {c["name"]: c["here"] for c in cluster["consumers"]}
    assert here[page_app.HEALTHY]["applies"] is True
    assert here[page_app.STALLED]["applies"] is False
    assert here[page_app.STALLED]["why"] == "not-declared"  # page-2 runs it
    assert here[page_app.HALTED]["applies"] is False
    assert here[page_app.HALTED]["why"] == "halted"
    assert f"projections resume {page_app.HALTED}" in here[page_app.HALTED]["reason"]
    assert "no_live_member" not in cluster

    dom = chromium(tmp_path / "profile-dom", "--dump-dom", url=base + "/admin")
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    assert f'data-member-row="{serving["id"]}" class="serving" data-serving="true"' in html
    assert "\u2605 this server" in html
    for name, verdict in EXPECTED.items():
        assert f'class="badge {verdict}" data-verdict="{verdict}">{verdict}</span>' in html
        assert f'data-lag-chart="{name}"' in html
    assert f'class="here no" data-why="halted" data-here="{page_app.HALTED}"' in html
    assert f'class="here yes" data-why="applies" data-here="{page_app.HEALTHY}"' in html
    screenshot(tmp_path, base + "/admin", height=2400, suffix="-" + db.engine.dialect.name)

    _assert_metrics(_metrics(base), serving["id"])


def _assert_metrics(samples: dict[str, list[Any]], member: str) -> None:
    """The ownership gauges, the partitioned fetches and the health state set, each with
    its attributes; every metric of ours with the tenant."""
    shares = {s.labels["consumer"]: s for s in samples["projections_partition_share"]}
    assert set(shares) == {page_app.HEALTHY, page_app.HALTED}  # page-2 exports nothing here
    for consumer, share in shares.items():
        assert share.labels["member"] == member and share.labels["instance"] == "page-1"
        assert share.value == (0.0 if consumer == page_app.HALTED else 1.0), share
    starts = {s.labels["consumer"]: s.value for s in samples["projections_partition_range_start"]}
    ends = {s.labels["consumer"]: s.value for s in samples["projections_partition_range_end"]}
    assert starts[page_app.HEALTHY] == 0 and ends[page_app.HEALTHY] == 4
    fetches = {
        s.labels["consumer"]: s.value for s in samples["projections_partitioned_fetches_total"]
    }
    assert fetches[page_app.HEALTHY] >= 1, fetches
    health = {
        (s.labels["consumer"], s.labels["verdict"]): s.value
        for s in samples["projections_consumer_health"]
    }
    for consumer, verdict in EXPECTED.items():
        assert health[(consumer, verdict)] == 1
        assert sum(v for (c, _), v in health.items() if c == consumer) == 1
    ours = [s for name, group in samples.items() if name.startswith("projections_") for s in group]
    assert len(ours) > 20
    assert {s.labels.get("tenant") for s in ours} == {TENANT}


def test_a_server_that_is_not_a_member_says_so(db: Database, tmp_path: Path) -> None:
    """``projections admin`` answers as a non-member and, with no instance running, says
    no member is live; without the plugin ``/metrics`` answers 404 saying how to enable it."""
    config = _config(tmp_path, db, plugin=False)
    with admin_process("admin", "--port", "0", "--config", str(config)) as (_, base):
        status, cluster = get_json(base + "/admin/cluster")
        assert status == 200
        assert cluster["serving"]["member"] is False
        assert "not a member" in cluster["serving"]["note"]
        assert cluster["no_live_member"].startswith("no member is live")
        assert get_json(base + "/metrics") == (404, {"error": NO_METRICS})
        dom = chromium(tmp_path / "profile", "--dump-dom", url=base + "/admin")
        assert dom.returncode == 0, dom.stderr
        assert 'id="serving" class="alarm"' in dom.stdout and "not a member" in dom.stdout
        assert 'id="no-live-member" class="alarm">no member is live' in dom.stdout
