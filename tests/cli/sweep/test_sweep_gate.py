"""`bench sweep` end to end on the tiny model (grid, repeats with confidence intervals, resume)
and `bench gate` (pass, fail, direction, unusable input)."""

from __future__ import annotations

import ast
import io
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from bench_cli.app import app
from bench_cli.gate.checks import Limit, check
from bench_cli.sweep.grid import grid, load_sweep
from bench_cli.sweep.options import SweepOptions
from bench_cli.sweep.row import aggregate, slo_attainment, t975
from bench_cli.sweep.runner import run_sweep
from bench_cli.sweep.table import knee
from engine.config import EngineConfig, engine_arg_names
from loadgen.config import RunConfig
from loadgen.profiles import PROFILE_DIR, build_config, load_profile

SWEEP = """
name = "two"
model = "tiny-smollm2"
arrival = "poisson"
num_requests = 6
warmup = 0
input_len = "uniform:8:32"
output_len = "4"
slo = "ttft=5,tpot=1"
max_num_seqs = 4
enforce_eager = true  # each point's server starts without torch.compile's tens of seconds
max_p99_lag_ms = 1000.0  # what a sweep does, on a busy machine too (INVALID: test_sweep_invalid)

[sweep]
batching = ["static", "continuous"]
rate = [20]
"""


SECRET = "sk-sweep-secret-42"


def sweep(tmp: Path, profile: Path, **kw: Any) -> tuple[int, str]:
    """As `bench sweep` calls it: every flag present, None when not given."""
    buf = io.StringIO()
    flags = {"base_url": None, "model": None, "api_key": None, "name": None, "out": None}
    flags |= kw.pop("flags", {"out": str(tmp / "sweep")})
    rc = run_sweep(
        str(profile),
        flags,
        SweepOptions(repeat=kw.pop("repeat", 1), resume=kw.pop("resume", None)),
        Console(file=buf, width=120),
    )
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    tmp = tmp_path_factory.mktemp("sweep")
    profile = tmp / "two.toml"
    profile.write_text(SWEEP)
    rc, printed = sweep(
        tmp, profile, repeat=2, flags={"out": str(tmp / "sweep"), "api_key": SECRET}
    )
    assert rc == 0, printed
    return tmp, profile, printed


def test_a_sweep_runs_every_point_and_repeat(swept: tuple[Path, Path, str]) -> None:
    tmp, _, printed = swept
    table = pd.read_csv(tmp / "sweep" / "sweep.csv")
    assert list(table["batching"]) == ["static", "continuous"]
    assert list(table["runs"]) == [2, 2] and list(table["completed"]) == [6, 6]
    for col in (
        "output_throughput",
        "output_throughput.std",
        "output_throughput.ci95",
        "ttft_s.p99",
        "tpot_s.p50",
        "goodput",
        "slo_attainment",
    ):
        assert col in table.columns
    assert (table["output_throughput.ci95"] >= 0).all()
    runs = sorted((tmp / "sweep").glob("p*/run*/summary.json"))
    assert len(runs) == 4  # 2 points x 2 runs, each an ordinary run folder
    batching = [
        json.loads(r.with_name("config.json").read_text())["engine"]["scheduler"]["batching"]
        for r in runs
    ]
    assert batching == ["static", "static", "continuous", "continuous"]  # each server's own
    assert "load: rate=20" in printed and "SLO knee" in printed
    page = (tmp / "sweep" / "report.html").read_text()
    assert "Throughput vs latency" in page and "Against rate" in page
    assert "plotly" in page and len(page) > 1_000_000  # plotly.js embedded: works offline
    assert not list((tmp / "sweep").glob("p*/run*/report.html"))  # one report a sweep


def test_no_file_a_sweep_writes_holds_its_api_key(swept: tuple[Path, Path, str]) -> None:
    tmp, _, _ = swept
    files = [p for p in (tmp / "sweep").rglob("*") if p.is_file()]
    assert len(files) > 10
    assert [p for p in files if SECRET in p.read_text(errors="replace")] == []
    assert json.loads((tmp / "sweep" / "sweep.json").read_text())["flags"]["api_key"] == "***"


def test_bench_report_rebuilds_from_files(swept: tuple[Path, Path, str]) -> None:
    tmp, _, _ = swept
    run = sorted((tmp / "sweep").glob("p*/run1"))[0]
    result = CliRunner().invoke(app, ["report", str(run), "--cdn"])
    assert result.exit_code == 0, result.output
    page = (run / "report.html").read_text()
    assert "Engine steps" in page and "cdn.plot.ly" in page and len(page) < 500_000
    result = CliRunner().invoke(app, ["report", str(tmp / "nothing")])
    assert result.exit_code == 2


def test_resume_reruns_only_what_did_not_finish(swept: tuple[Path, Path, str]) -> None:
    tmp, profile, _ = swept
    kept = sorted((tmp / "sweep").glob("p*/run*/summary.json"))
    stamps = {p: p.stat().st_mtime_ns for p in kept}
    os.remove(kept[-1])  # as if Ctrl-C had stopped this run
    # started with --out DIR --api-key KEY; resumed with --resume DIR alone: neither changes
    # a result, so neither makes it another sweep
    rc, printed = sweep(tmp, profile, repeat=2, resume=str(tmp / "sweep"), flags={})
    assert rc == 0, printed
    assert printed.count("done before, kept") == 3
    for p in kept[:-1]:
        assert p.stat().st_mtime_ns == stamps[p]
    assert kept[-1].exists()
    assert len(pd.read_csv(tmp / "sweep" / "sweep.csv")) == 2


def test_resume_reruns_an_invalid_point_under_a_new_lag_limit(
    swept: tuple[Path, Path, str],
) -> None:
    """An INVALID run did not offer the load asked for: --resume runs it again, and the lag
    limit, which judges the schedule and changes no measured number, may change meanwhile."""
    tmp, _, _ = swept
    kept = sorted((tmp / "sweep").glob("p*/run*/summary.json"))
    summary = json.loads(kept[0].read_text())
    kept[0].write_text(json.dumps(summary | {"valid": False}))
    stamps = {p: p.stat().st_mtime_ns for p in kept}
    looser = tmp / "looser.toml"
    looser.write_text(SWEEP.replace("max_p99_lag_ms = 1000.0", "max_p99_lag_ms = 2000.0"))
    rc, printed = sweep(tmp, looser, repeat=2, resume=str(tmp / "sweep"), flags={})
    assert rc == 0, printed
    assert printed.count("done before, kept") == 3
    assert kept[0].stat().st_mtime_ns != stamps[kept[0]]
    assert json.loads(kept[0].read_text())["max_p99_lag_s"] == 2.0


def test_resume_refuses_a_changed_sweep(swept: tuple[Path, Path, str]) -> None:
    tmp, profile, _ = swept
    rc, printed = sweep(tmp, profile, repeat=3, resume=str(tmp / "sweep"), flags={})
    assert rc == 2 and "changed since it started: repeat" in printed
    rc, printed = sweep(tmp, profile, resume=str(tmp / "sweep"), flags={"model": "other"})
    assert rc == 2 and "changed since it started: flags, repeat" in printed


def test_sweep_errors_are_printed_as_written(tmp_path: Path) -> None:
    """Rich markup would eat `[sweep]` out of the message, and wrapping would fold a long
    path through it (the CI's temporary folder once grew one character too many)."""
    deep = tmp_path / ("d" * 150)
    deep.mkdir()
    plain = deep / "plain.toml"
    plain.write_text('name = "x"\n')
    rc, printed = sweep(tmp_path, plain)
    assert rc == 2 and "has no [sweep] table" in printed, printed


def test_slo_attainment_counts_failed_requests_as_misses() -> None:
    # 8 completed, all inside the SLO, 2 failed: 8 of the 10 sent met it (DistServe)
    summary = _summary(completed=8, failed=2, request_throughput=0.8, goodput=0.8)
    assert slo_attainment(summary) == pytest.approx(0.8)
    assert slo_attainment(_summary(completed=0, failed=5, request_throughput=0.0)) == 0.0
    assert slo_attainment(_summary(goodput=None)) is None  # no SLO given


def test_slo_knee_is_not_reached_when_every_load_met_the_slo() -> None:
    def row(rate: float, attainment: float) -> dict[str, Any]:
        return {"rate": rate, "slo_attainment": attainment}

    assert knee([row(1, 0.99), row(2, 0.95), row(4, 0.91)], "rate") == "not reached up to 4"
    assert knee([row(1, 0.99), row(2, 0.95), row(4, 0.5)], "rate") == "2"
    assert knee([row(1, 0.5), row(2, 0.2)], "rate") == "none"


def test_sweep_profiles_and_grid(tmp_path: Path) -> None:
    base, axes = load_sweep("smoke")
    assert base["model"] == "tiny-smollm2" and list(axes) == ["batching", "rate"]
    points = grid(axes)
    assert [p.values for p in points][:2] == [
        {"batching": "static", "rate": 4},
        {"batching": "static", "rate": 16},
    ]
    assert len({p.dirname for p in points}) == 4
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[sweep]\nrate = 2\n')
    with pytest.raises(ValueError, match="non-empty list"):
        load_sweep(str(bad))
    with pytest.raises(ValueError, match="no \\[sweep\\]"):
        load_sweep("default")


def test_confidence_intervals() -> None:
    assert t975(1) == pytest.approx(12.706) and t975(30) == pytest.approx(2.042)
    assert t975(120) == pytest.approx(1.98, abs=0.002)  # the true value is 1.980
    point = grid({"rate": [1]})[0]
    summaries = [_summary(output_throughput=v) for v in (10.0, 12.0, 14.0)]
    row = aggregate(point, summaries)
    assert row["output_throughput"] == pytest.approx(12.0)
    assert row["output_throughput.std"] == pytest.approx(2.0)
    assert row["output_throughput.ci95"] == pytest.approx(4.303 * 2.0 / 3**0.5)


def _summary(**over: float) -> dict[str, Any]:
    dist = {"mean": 0.1, "p50": 0.1, "p90": 0.1, "p95": 0.1, "p99": 0.1, "max": 0.1, "count": 1}
    s: dict[str, Any] = {k: dict(dist) for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s")}
    s |= {"ttft_with_queue_s": dict(dist), "schedule_lag_s": dict(dist)}
    s |= {
        "request_throughput": 1.0,
        "output_throughput": 10.0,
        "total_token_throughput": 20.0,
        "goodput": 1.0,
        "completed": 10,
        "failed": 0,
        "duration_s": 10.0,
        "valid": True,
    }
    return s | over


# ---- bench gate ----------------------------------------------------------------------------


def write_run(path: Path, **over: Any) -> Path:
    """A run folder's summary.json; `load` is its config's run settings (as RunConfig.to_dict)."""
    path.mkdir(parents=True)
    s = _summary(**{k: v for k, v in over.items() if k not in ("ttft_p99", "load")})
    if "ttft_p99" in over:
        s["ttft_s"]["p99"] = over["ttft_p99"]
    if "load" in over:
        s["config"] = {"run": RunConfig(**over["load"]).to_dict()}
    (path / "summary.json").write_text(json.dumps(s))
    return path


def gate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["gate", *args])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def test_gate_passes_and_fails_by_direction(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", output_throughput=100.0, ttft_p99=0.200)
    better = write_run(tmp_path / "better", output_throughput=120.0, ttft_p99=0.150)
    worse = write_run(tmp_path / "worse", output_throughput=94.0, ttft_p99=0.230)
    limits = ["--max-regression", "output_throughput=5%", "--max-regression", "ttft_s.p99=10%"]
    rc, out = gate(str(better), "--baseline", str(base), *limits)
    assert rc == 0 and "FAIL" not in out
    rc, out = gate(str(worse), "--baseline", str(base), *limits)
    assert rc == 1 and out.count("FAIL") == 2  # -6 % throughput, +15 % TTFT p99
    rc, _ = gate(str(worse), "--baseline", str(base), "--max-regression", "ttft_s.p99=20%")
    assert rc == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-regression", "latency=5%"], "cannot be gated"),
        (["--max-regression", "ttft_s.p42=5%"], "cannot be gated"),
        (["--max-regression", "goodput=five%"], "not a percentage"),
        (["--max-regression", "goodput"], "METRIC=PERCENT"),
        (["--max-regression", "itl_per_token_s.p99=5%"], "has no metric"),
    ],
)
def test_gate_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    base = write_run(tmp_path / "base")
    rc, out = gate(str(base), "--baseline", str(base), *args)
    assert rc == 2 and message in out


def test_gate_missing_folder_exits_2(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base")
    rc, out = gate(
        str(tmp_path / "nope"), "--baseline", str(base), "--max-regression", "goodput=1%"
    )
    assert rc == 2 and "no summary.json" in out


def test_limits_parse_and_check() -> None:
    assert Limit.parse("output_throughput=5%").max_regression == pytest.approx(0.05)
    assert Limit.parse("ttft_s.p99=0.1").max_regression == pytest.approx(0.1)
    assert check(Limit("failed", 0.0), 0.0, 0.0).passed
    assert not check(Limit("failed", 0.0), 0.0, 3.0).passed  # from none to some
    assert check(Limit("goodput", 0.0), 0.0, 1.0).passed


def write_sweep(
    path: Path,
    rows: list[dict[str, Any]],
    axes: tuple[str, ...] = ("batching", "rate"),
    **plan: Any,
) -> Path:
    path.mkdir(parents=True)
    (path / "sweep.json").write_text(json.dumps({"axes": {a: [] for a in axes}, **plan}))
    pd.DataFrame(rows).to_csv(path / "sweep.csv", index=False)
    return path


def test_gate_sweeps_point_by_point_and_calls_overlapping_cis_noise(tmp_path: Path) -> None:
    def row(batching: str, rate: int, tput: float, ci: float) -> dict[str, Any]:
        return {
            "batching": batching,
            "rate": rate,
            "output_throughput": tput,
            "output_throughput.ci95": ci,
        }

    base = write_sweep(tmp_path / "base", [row("static", 1, 100, 2), row("continuous", 1, 200, 2)])
    # static: -6 % but the intervals overlap (94 +- 5 vs 100 +- 2): noise, not a failure;
    # continuous: -20 %, far outside both intervals: a regression.
    cur = write_sweep(tmp_path / "cur", [row("static", 1, 94, 5), row("continuous", 1, 160, 2)])
    rc, out = gate(str(cur), "--baseline", str(base), "--max-regression", "output_throughput=5%")
    assert rc == 1 and "noise" in out and out.count("FAIL") == 1


def test_gate_ratios_inside_one_sweep(tmp_path: Path) -> None:
    rows = [
        {"batching": "static", "rate": 1, "output_throughput": 50.0},
        {"batching": "continuous", "rate": 1, "output_throughput": 120.0},
        {"batching": "static", "rate": 2, "output_throughput": 60.0},
        {"batching": "continuous", "rate": 2, "output_throughput": 100.0},
    ]
    sweep_dir = write_sweep(tmp_path / "s", rows)
    ratio = "output_throughput[batching=continuous]/output_throughput[batching=static]>=2"
    rc, out = gate(str(sweep_dir), "--ratio", ratio)
    assert rc == 1 and "rate=1" in out and out.count("FAIL") == 1  # x2.4 passes, x1.67 fails
    rc, _ = gate(str(sweep_dir), "--ratio", ratio.replace(">=2", ">=1.5"))
    assert rc == 0
    for bad, message in (
        ("output_throughput[batching=continuous]/goodput[batching=static]>=2", "expected"),
        ("output_throughput[mode=a]/output_throughput[mode=b]>=2", "not axes"),
        ("output_throughput[batching=fast]/output_throughput[batching=static]>=2", "no row"),
    ):
        rc, out = gate(str(sweep_dir), "--ratio", bad)
        assert rc == 2 and message in out, out
    rc, out = gate(str(sweep_dir))
    assert rc == 2 and "nothing to check" in out


def test_bench_cli_has_no_import_cycle() -> None:
    """Every import counts, those inside functions too: a circle means two modules that can
    only be understood (and loaded) together."""
    package = Path(__file__).resolve().parents[3] / "bench_cli"
    imports: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports[f"bench_cli.{path.stem}"] = {m for m in found if m.startswith("bench_cli.")}

    def reaches(start: str, seen: set[str]) -> set[str]:
        for m in imports.get(start, set()) - seen:
            seen.add(m)
            reaches(m, seen)
        return seen

    circles = sorted(m for m in imports if m in reaches(m, set()))
    assert circles == [], f"modules on an import circle: {circles}"


def test_gate_prints_a_ratio_as_written(tmp_path: Path) -> None:
    """Rich markup would eat `[batching=continuous]` out of the check's name."""
    rows = [
        {"batching": "static", "rate": 1, "output_throughput": 50.0},
        {"batching": "continuous", "rate": 1, "output_throughput": 120.0},
    ]
    ratio = "output_throughput[batching=continuous]/output_throughput[batching=static]>=2"
    rc, out = gate(str(write_sweep(tmp_path / "s", rows)), "--ratio", ratio)
    assert rc == 0 and ratio in out


@pytest.mark.parametrize(("static", "continuous"), [(0.0, 0.0), (0.0, 10.0), (10.0, 0.0)])
def test_a_ratio_with_a_zero_side_fails(tmp_path: Path, static: float, continuous: float) -> None:
    rows = [
        {"batching": "static", "rate": 1, "output_throughput": static},
        {"batching": "continuous", "rate": 1, "output_throughput": continuous},
    ]
    sweep_dir = write_sweep(tmp_path / "s", rows)
    for op in (">=2", "<=2"):  # 0/0 and x/0 are not infinitely good, 0/x not perfectly small
        ratio = f"output_throughput[batching=continuous]/output_throughput[batching=static]{op}"
        rc, out = gate(str(sweep_dir), "--ratio", ratio)
        side = "denominator" if static == 0 else "numerator"
        assert rc == 1 and out.count("FAIL") == 1 and f"the {side} is 0" in out, out


def test_a_ratio_missing_one_side_at_a_point_is_unusable(tmp_path: Path) -> None:
    rows = [
        {"batching": "static", "rate": 1, "output_throughput": 50.0},
        {"batching": "continuous", "rate": 1, "output_throughput": 120.0},
        {"batching": "continuous", "rate": 2, "output_throughput": 120.0},  # static never ran
    ]
    ratio = "output_throughput[batching=continuous]/output_throughput[batching=static]>=2"
    rc, out = gate(str(write_sweep(tmp_path / "s", rows)), "--ratio", ratio)
    assert rc == 2 and "no row" in out and "matches [batching=static] at rate=2" in out


def test_ratio_selectors_compare_numbers_and_booleans_by_value(tmp_path: Path) -> None:
    rows = [  # pandas writes True/False and 1.0 to the CSV
        {"enable_chunked_prefill": c, "rate": r, "output_throughput": t}
        for c, r, t in (
            (True, 1.0, 90.0),
            (False, 1.0, 60.0),
            (True, 2.5, 150.0),
            (False, 2.5, 70.0),
        )
    ]
    sweep_dir = write_sweep(tmp_path / "s", rows, ("enable_chunked_prefill", "rate"))
    by_flag = (
        "output_throughput[enable_chunked_prefill=true]"
        "/output_throughput[enable_chunked_prefill=FALSE]"
    )
    rc, out = gate(str(sweep_dir), "--ratio", f"{by_flag}>=1.4")
    assert rc == 0 and out.count("pass") == 2, out  # x1.5 and x2.14
    by_rate = "output_throughput[rate=2.50]/output_throughput[rate=1]"
    rc, out = gate(str(sweep_dir), "--ratio", f"{by_rate}>=1.5")
    assert rc == 1 and out.count("pass") == 1 and out.count("FAIL") == 1, out  # x1.67, x1.17


def test_a_ratio_selector_matching_several_rows_is_unusable(tmp_path: Path) -> None:
    rows = [
        {"batching": b, "prefill": p, "rate": 1, "output_throughput": t}
        for b, p, t in (
            ("static", "on", 50),
            ("static", "off", 40),
            ("continuous", "on", 120),
            ("continuous", "off", 90),
        )
    ]
    sweep_dir = write_sweep(tmp_path / "s", rows, ("batching", "prefill", "rate"))
    ratio = (
        "output_throughput[batching=continuous]/output_throughput[batching=static,prefill=off]>=2"
    )
    rc, out = gate(str(sweep_dir), "--ratio", ratio)
    assert rc == 2 and "matches 2 rows" in out, out
    assert "batching=continuous prefill=on rate=1; batching=continuous prefill=off rate=1" in out


def test_gate_refuses_a_sweep_listing_a_point_twice(tmp_path: Path) -> None:
    row = {"batching": "static", "rate": 1, "output_throughput": 100.0}
    base = write_sweep(tmp_path / "base", [row])
    cur = write_sweep(tmp_path / "cur", [row, row | {"output_throughput": 50.0}])
    rc, out = gate(str(cur), "--baseline", str(base), "--max-regression", "output_throughput=5%")
    assert rc == 2 and "two rows for the point 'batching=static rate=1'" in out, out


def test_gate_matches_sweep_points_by_value(tmp_path: Path) -> None:
    def row(rate: float) -> dict[str, Any]:
        return {"batching": "static", "rate": rate, "output_throughput": 100.0}

    base = write_sweep(tmp_path / "base", [row(1), row(2.5)])  # the CSV says 1.0 and 2.5
    cur = write_sweep(tmp_path / "cur", [row(1), row(2)])  # 1 and 2
    rc, out = gate(str(cur), "--baseline", str(base), "--max-regression", "output_throughput=5%")
    assert rc == 0 and out.count("pass") == 1 and "rate=1 " in out, out


def test_gate_warns_when_the_two_ran_different_loads(tmp_path: Path) -> None:
    poisson = {"arrival": "poisson", "rate": 1.0, "num_requests": 50, "input_len": "256"}
    closed = {"arrival": "poisson", "concurrency": 4, "num_requests": 50, "input_len": "256"}
    base = write_run(tmp_path / "base", load=poisson)
    same = write_run(tmp_path / "same", load=poisson)
    other = write_run(tmp_path / "other", load=closed)
    limit = ("--max-regression", "output_throughput=5%")
    rc, out = gate(str(same), "--baseline", str(base), *limit)
    assert rc == 0 and "warning" not in out
    rc, out = gate(str(other), "--baseline", str(base), *limit)
    assert rc == 0 and "not given the same load" in out
    assert "rate: 1.0 -> None; concurrency: None -> 4" in out
    # sweeps: the profile's load (defaults where silent), less the axes points are matched on
    row = {"batching": "static", "rate": 1, "output_throughput": 100.0}
    base = write_sweep(tmp_path / "sb", [row], profile={"input_len": "256", "rate": 9})
    cur = write_sweep(tmp_path / "sc", [row], profile={"input_len": "1024"})
    rc, out = gate(str(cur), "--baseline", str(base), *limit)
    assert "input_len: 256 -> 1024" in out and "rate:" not in out, out


def test_gate_says_a_single_run_has_no_noise_estimate(tmp_path: Path) -> None:
    base, cur = write_run(tmp_path / "base"), write_run(tmp_path / "cur")
    rc, out = gate(str(cur), "--baseline", str(base), "--max-regression", "goodput=5%")
    assert rc == 0 and "no noise estimate" in out and "bench sweep --repeat N" in out
    row = {"batching": "static", "rate": 1, "runs": 3, "goodput": 1.0, "goodput.ci95": 0.1}
    base, cur = write_sweep(tmp_path / "sb", [row]), write_sweep(tmp_path / "sc", [row])
    rc, out = gate(str(cur), "--baseline", str(base), "--max-regression", "goodput=5%")
    assert rc == 0 and "noise estimate" not in out


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))
def test_every_shipped_profile_builds_valid_runs_and_engine_settings(name: str) -> None:
    """A typo in a profile (a key, a value an engine would refuse) fails here, not an hour into
    someone's sweep."""
    profile = load_profile(name)
    points = profile.pop("phase", None) or [{}]  # bench calibrate's phases: runs of their own
    if "sweep" in profile:
        profile, axes = load_sweep(name)
        points = [p.settings for p in grid(axes)]
    for values in points:
        cfg = build_config({**profile, **values}, {}, engine_arg_names())
        cfg.validate()
        EngineConfig.from_kwargs(cfg.model or "smollm2-135m", **cfg.engine)


def test_a_bundle_axis_spreads_its_settings_and_is_named_by_its_label(tmp_path: Path) -> None:
    from bench_cli.report.sweep import sweep_report
    from bench_cli.sweep.point import point_flags

    axes = {
        "prefill": [
            {"max_num_batched_tokens": 64},
            {"max_num_batched_tokens": 256},
            {"label": "off", "enable_chunked_prefill": False},
        ],
        "rate": [1, 2],
    }
    points = grid(axes)
    assert [p.values for p in points][::2] == [
        {"prefill": "max_num_batched_tokens=64", "rate": 1},
        {"prefill": "max_num_batched_tokens=256", "rate": 1},
        {"prefill": "off", "rate": 1},
    ]
    assert points[4].settings == {"enable_chunked_prefill": False, "rate": 1}
    flags = point_flags({"model": "m", "batching": None}, points[4], tmp_path)
    assert flags["enable_chunked_prefill"] is False and "prefill" not in flags
    assert "max_num_batched_tokens" not in flags
    # the row keeps the label and the bundle's settings; the report plots latency against the
    # numeric setting, with the bundle that has none as a reference line
    rows = [aggregate(p, [_summary()]) for p in points]
    assert (
        rows[0]["prefill"] == "max_num_batched_tokens=64"
        and rows[0]["max_num_batched_tokens"] == 64
    )
    assert rows[4]["enable_chunked_prefill"] is False
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": axes, "repeat": 1}))
    page = sweep_report(tmp_path, embed=False).read_text()
    assert "Latency against max_num_batched_tokens" in page and "Against rate" in page
    assert "Settings side by side" in page
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nrate = [{label = "x"}]\n')
    with pytest.raises(ValueError, match="load axis"):
        load_sweep(str(bad))
