"""The benchmark contract: one judge and writer for every command (verdict, exit status, JSON
result, the recorded report), docs/benchmarks.md generated from the reports, and the lists of
commands in the README and the import-linter contract kept equal to the command table."""

from __future__ import annotations

import argparse
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from loadtest import cli
from loadtest.harness import benchpage, contract, fixed, pipeline_report
from loadtest.harness.report import Target

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["bench-ingest", "--rounds", "2"], ["bench-ingest", "--rounds", "2"]),
        (["bench-ingest", "--results", "/tmp/x", "--record", "--pin"], ["bench-ingest", "--pin"]),
        (["bench-send", "--results=/tmp/x", "--latency"], ["bench-send", "--latency"]),
    ],
)
def test_the_recorded_command_leaves_out_where_the_result_went(argv: list[str], shown: list[str]) -> None:
    assert contract.shown_argv(argv) == shown


@pytest.mark.parametrize(
    ("rounds", "op", "value", "met"),
    [
        ([1.0, 3.0, 2.0], "<=", 2.0, True),
        ([2.5, 3.0, 1.0], "<=", 2.5, False),
        ([0.5, 0.7, 0.9, 0.8], ">=", 0.75, True),
        ([], ">=", None, False),  # no round measured is no pass
    ],
)
def test_a_target_over_rounds_is_judged_on_their_median(
    rounds: list[float], op: str, value: float | None, met: bool
) -> None:
    t = Target.median("x", rounds, 2.0 if op == "<=" else 0.7, op)
    assert t.value == value and t.met is met and t.rounds == tuple(rounds)


def namespace(tmp_path: Path, record: bool) -> argparse.Namespace:
    return argparse.Namespace(
        command="bench-demo", argv=["bench-demo", "--rounds", "3", "--record"], results=tmp_path / "results",
        record=record, rounds=3, main=print,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rounds", "ok", "code"),
    [([1.0, 1.5, 1.2], True, 0), ([3.0, 2.5, 1.0], True, 1), ([1.0, 1.5, 1.2], False, 1)],
)
def test_finish_prints_writes_and_gives_the_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    rounds: list[float], ok: bool, code: int,
) -> None:  # fmt: skip
    monkeypatch.setattr(contract, "REPORTS", tmp_path / "reports")
    run = contract.Run(namespace(tmp_path, record=True))
    run.median("cost ratio", rounds, 2.0, "<=", "x")
    run.check("every event once", ok, "3 lost")
    assert run.finish({"figure": 42}, "the figures") == code
    out = capsys.readouterr().out
    assert out.index("the figures") < out.index("load average") < out.index("cost ratio")
    assert ("MISSED cost ratio" in out) is (code == 1 and ok)
    assert out.rstrip().splitlines()[-1] == ("PASS" if code == 0 else out.rstrip().splitlines()[-1])
    (written,) = (tmp_path / "results").glob("bench-demo-*.json")
    kept = tmp_path / "reports" / "bench-demo.json"
    assert written.read_text() == kept.read_text()
    doc = contract.load(kept)
    assert doc["argv"] == ["bench-demo", "--rounds", "3"] and doc["figure"] == 42
    assert doc["parameters"]["rounds"] == 3 and "main" not in doc["parameters"]
    (target,) = doc["verdict"]["targets"]
    assert target["rounds"] == rounds and target["met"] is (sorted(rounds)[1] <= 2.0)
    assert doc["verdict"]["failed_checks"] == ([] if ok else ["every event once: 3 lost"])


def test_without_record_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contract, "REPORTS", tmp_path / "reports")
    assert contract.Run(namespace(tmp_path, record=False)).finish({}, "") == 0
    assert not (tmp_path / "reports").exists()


def report_doc(key: str, targets: list[dict[str, Any]], failed: list[str] | None = None) -> dict[str, Any]:
    return {
        "command": key, "key": key, "argv": [key, "--rounds", "3"], "finished": "2026-12-03T18:00:00+00:00",
        "load_average": [1.23, 1.0, 0.5], "verdict": {"targets": targets, "failed_checks": failed or []},
    }  # fmt: skip


def test_the_table_has_one_line_per_target_and_one_for_failed_checks() -> None:
    cost = {"name": "cost", "value": 2.5, "goal": 2, "op": "<=", "unit": "x", "met": False}
    cost["rounds"] = [2.5, 3, 2]
    rate = {"name": "rate", "value": 1234.5, "goal": 1000, "op": ">=", "unit": "/s", "met": True}
    table = benchpage.table([report_doc("bench-a", [cost, rate], ["lost: 3"])])
    command, when = "`python -m loadtest bench-a --rounds 3`", "2026-12-03, load 1.2"
    assert table.splitlines()[2:] == [
        f"| cost <= 2x | {command} | **2.5x** (2.5 / 3 / 2) | **missed** | {when} |",
        f"| rate >= 1 000/s | {command} | **1 234/s** | met | {when} |",
        f"| checks | {command} | lost: 3 | **failed** | {when} |",
    ]


def test_render_replaces_only_the_table() -> None:
    page = f"# B\n\nprose\n\n{benchpage.BEGIN}\nold table\n{benchpage.END}\n\nmore prose\n"
    out = benchpage.render(page, [report_doc("k", [])])
    assert out.startswith("# B\n\nprose\n\n") and out.endswith(f"{benchpage.END}\n\nmore prose\n")
    assert "old table" not in out and "| checks |" in out
    with pytest.raises(ValueError):
        benchpage.render("no markers", [])


def test_the_benchmarks_page_is_what_the_reports_give() -> None:
    """docs/benchmarks.md's table is generated: after recording a run, run
    `python -m loadtest render-benchmarks`."""
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    docs = benchpage.reports(contract.REPORTS)
    assert docs, "no recorded report in loadtest/reports"
    assert benchpage.render(page, docs) == page


def test_every_recorded_report_is_one_the_contract_wrote() -> None:
    for path in contract.REPORTS.iterdir():
        assert path.suffix == ".json", f"{path.name}: loadtest/reports holds the contract's reports only"
        assert contract.load(path)["key"] == path.stem


MODULES = [cli.module_name(name) for name in cli.COMMANDS]


def test_every_command_keeps_the_module_shape_and_the_common_options() -> None:
    parser = cli.build_parser()
    for name in cli.COMMANDS:
        module = cli.command(name)
        assert isinstance(module.HELP, str) and callable(module.add_args) and callable(module.main)
        extra = {"render": ["x.json"], "verify": ["--database-url", "x"]}.get(name, [])
        ns = parser.parse_args([name, "--record", "--results", "/tmp/r", *extra])
        assert ns.command == name and ns.record and ns.results == Path("/tmp/r")


def test_the_readme_layout_lists_every_command() -> None:
    text = (ROOT / "loadtest" / "README.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout") :]
    rows = re.findall(r"^\| `([a-z-]+)` \| `([a-z_]+)\.py` \|$", layout, re.M)
    assert rows == [(name, cli.module_name(name)) for name in cli.COMMANDS]


def test_the_import_contract_lists_every_command() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c.get("layers", [""])[0] == "loadtest.cli"]
    listed = [m.strip() for m in layers[1].split("|")]
    assert listed == [f"loadtest.{m}" for m in MODULES] + ["loadtest.locustfile"]


def pipeline_result(ratios: list[float], relay_rate: float, pipe_rate: float) -> dict[str, Any]:
    def side(us: float) -> dict[str, Any]:
        return {"us": us, "missing": {"std": 0, "meta": 0}, "webhooks": 100}

    rounds = [{"round": n, "ratio": r, "relay": side(1), "gateway": side(r)} for n, r in enumerate(ratios)]
    return {
        "cost": {"rate": 300.0, "seconds": 5.0, "rounds": rounds},
        "relay_saturation": {"rate": relay_rate, "runs": []},
        "pipeline": {"rate": pipe_rate, "low": 50.0, "high": pipe_rate * 1.1, "probes": []},
        "deliveries": {"delivered": 10},
    }


@pytest.mark.parametrize(
    ("ratios", "relay", "pipe", "missed"),
    [
        ([1.5, 1.9, 2.4], 1000.0, 700.0, set()),
        ([2.5, 1.9, 2.4], 1000.0, 700.0, {"pipeline cost"}),
        ([1.5, 1.9, 2.4], 1000.0, 500.0, {"pipeline saturation"}),
    ],
)
def test_bench_pipeline_judges_cost_and_saturation_against_the_relay(
    ratios: list[float], relay: float, pipe: float, missed: set[str]
) -> None:
    v = pipeline_report.verdict(pipeline_result(ratios, relay, pipe))
    assert {t.name.split(" at ")[0].split(" /")[0] for t in v.targets if not t.met} == missed
    assert not v.failed_checks


def split_round(n: int, bare: float, relay: float, alone: float, both: float) -> dict[str, Any]:
    def side(us: float, serve: bool = False) -> dict[str, Any]:
        x: dict[str, Any] = {"us": us, "missing": {}, "webhooks": 100, "errors": 0}
        if serve:
            x.update(serve_us=us / 2, postgres_us=us / 2, roles_us={"worker": us / 2})
        return x

    return {
        "round": n, "ratio": both / relay, "bare": side(bare), "relay": side(relay),
        "alone": side(alone, True), "gateway": side(both, True),
    }  # fmt: skip


def test_bench_pipeline_split_says_what_receiving_storing_and_forwarding_cost() -> None:
    cost = {"rate": 300.0, "seconds": 5.0, "rounds": [split_round(0, 300, 900, 1400, 2100)]}
    text = pipeline_report.table({"cost": cost})
    lines = text.split("where it goes")[1].splitlines()
    head, row = lines[1], lines[3]
    cells = dict(zip((c.strip() for c in head.split("  ") if c.strip()), row.split(), strict=True))
    assert cells == {
        "round": "1", "bare handler": "300", "relay's POSTs": "600", "serve alone": "1400", "storing": "1100",
        "forwarding": "700", "serve alone / relay": "1.56",
    }  # fmt: skip
    plain = {k: v for k, v in split_round(0, 300, 900, 1400, 2100).items() if k not in ("bare", "alone")}
    assert "where it goes" not in pipeline_report.table({"cost": {**cost, "rounds": [plain]}})


def test_bench_pipeline_fails_a_cost_round_whose_webhooks_failed() -> None:
    rnd = split_round(0, 300, 900, 1400, 1700)
    rnd["alone"]["errors"] = 3
    cost = {"rate": 300.0, "seconds": 5.0, "rounds": [rnd]}
    result = {**pipeline_result([1.5], 1000.0, 700.0), "cost": cost}
    v = pipeline_report.verdict(result)
    assert v.failed_checks == ["cost round 1: alone: 3 webhooks failed"]
    assert all(t.met for t in v.targets)


def test_serve_cost_is_per_request_against_the_bare_handlers_own() -> None:
    def run(server: str, rnd: int, server_us: float, pg_us: float) -> fixed.Run:
        r = fixed.Run(server, 64, rnd, 1000.0, 1.0, 2.0, 0, 0, {}, backlog_end=0)
        r.us_per_request = {"server": server_us, "postgres": pg_us}
        return r

    runs = [
        run("bare", 0, 40.0, 30.0), run("edge", 0, 60.0, 20.0), run("serve", 0, 100.0, 60.0),
        run("bare", 1, 50.0, 0.0), run("edge", 1, 60.0, 20.0), run("serve", 1, 100.0, 100.0),
    ]  # fmt: skip
    cost = fixed.summarise(runs, [64])["cost_ratios"]["serve/bare CPU per request c64"]
    assert cost["rounds"] == [4.0, 4.0]  # (100 + 60) / 40, (100 + 100) / 50: PostgreSQL is serve's alone


TOOLS = {"render", "render-benchmarks"}  # they measure nothing: they re-draw saved results


@pytest.mark.parametrize("name", [n for n in cli.COMMANDS if n not in TOOLS])
def test_every_measuring_command_hands_its_verdict_to_the_contract(name: str) -> None:
    source = inspect.getsource(cli.command(name))
    assert "contract.Run(" in source and ".finish(" in source
    # No verdict of its own: "met / NOT met", PASS or FAIL are the contract's to print.
    assert not re.search(r"print\([^)]*(NOT met|MISSED|\"PASS|\"FAIL)", source)
