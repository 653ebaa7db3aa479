"""Run the selected claims, one folder each under the claims folder, each an ordinary sweep
(plus, for some, one measurement beside it); judge each as soon as it finishes and rewrite
claims.json, so an interrupted run keeps every finished claim and `--resume` skips them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench_cli.claims.catalog import CLAIMS, select
from bench_cli.claims.claim import Claim, Scale, Simulation, models_run
from bench_cli.claims.evidence import read_sweep
from bench_cli.claims.verdict import Finding, unmeasurable
from bench_cli.console import print_error
from bench_cli.export import environment, run_dir, write_json
from bench_cli.run.execute import INVALID_EXIT
from loadgen.redact import redact_url

INVALID_SWEEP = (
    "INVALID: the load generator fell behind its schedule (a busy machine?), so the load "
    "offered was not the one the claim asks for; --resume runs its INVALID points again, "
    "--max-p99-lag-ms loosens the limit (see {})"
)


def run_claims(
    only: str | None,
    quick: bool,
    model: str | None,
    base_url: str | None,
    out: str | None,
    resume: str | None,
    dashboard: bool,
    console: Console,
    sim_flags: SimFlags | None = None,
    max_p99_lag_ms: float | None = None,
) -> int:
    from bench_cli.claims.output import print_table, write_html

    try:
        claims = select(only)
        sim = sim_flags.simulation(quick, model, base_url, console) if sim_flags else None
        if max_p99_lag_ms is not None and not max_p99_lag_ms > 0:
            raise ValueError(f"--max-p99-lag-ms {max_p99_lag_ms:g}: give a number above 0")
        scale = Scale.of(quick, model, base_url, sim, max_p99_lag_ms)
        folder = Path(resume) if resume else run_dir(out, "claims")
        record = _start(folder, scale, claims, resume is not None)
    except (ValueError, OSError) as e:
        print_error(console, str(e))
        return 2
    todo = [c for c in claims if c.id not in record["findings"]]
    minutes = sum(c.minutes[0 if quick else 1] for c in todo if c.runs_at(scale))
    where = f"about {minutes:.0f} min on a 2-core CPU"
    if sim is not None:
        where = f"SIMULATED on {sim.where}, arrival rates x {sim.rate_factor:g}"
    console.print(
        f"bench claims: {len(claims)} claims ({len(claims) - len(todo)} done before) on "
        f"{models_run(claims, scale)}{' (quick)' if quick else ''}, {where} -> {folder}/",
        highlight=False,
    )
    code = 0
    failed: dict[str, Finding] = {}  # not kept in claims.json: --resume runs them again
    for k, claim in enumerate(todo, 1):
        console.rule(escape(f"claim {claim.id} ({k}/{len(todo)}): {claim.title}"))
        result = _run_claim(claim, scale, folder / f"{claim.id}-{claim.slug}", dashboard, console)
        if isinstance(result, int):  # interrupted: keep what finished
            code = result
            break
        found = result.finding if isinstance(result, Failed) else result
        said = found.measured if found.measured != "-" else found.why
        console.print(f"  {found.verdict}: {escape(said)}", highlight=False)
        if isinstance(result, Failed):
            failed[claim.id] = found
            code = 1  # a claims run that could not measure a claim is no success
            continue
        record["findings"][claim.id] = found.to_dict()
        write_json(folder / "claims.json", record)
    findings = {k: Finding.from_dict(v) for k, v in record["findings"].items()} | failed
    shown = [c for c in CLAIMS if c in claims or c.id in findings]  # and earlier runs' claims
    print_table(console, shown, findings, scale, record["environment"])
    write_html(folder, shown, findings, record)
    console.print(f"claims: {folder}/claims.json and claims.html", highlight=False)
    return code


@dataclass(frozen=True, slots=True)
class SimFlags:
    """`bench claims`' simulation flags as given."""

    engine: str | None = None
    device: str | None = None
    cost_model: str | None = None
    profile: str | None = None
    tensor_parallel_size: int = 1

    def simulation(
        self, quick: bool, model: str | None, base_url: str | None, console: Console
    ) -> Simulation | None:
        """The simulation these flags ask for (None: the real engine), its rates scaled."""
        from bench_cli.claims.simulated import simulation

        if self.engine not in (None, "bundled", "sim"):
            raise ValueError(f"--engine {self.engine!r}: expected bundled or sim")
        if self.engine != "sim":
            given = [name for name, v in self._sim_flags().items() if v]
            if given:
                raise ValueError(f"{', '.join(given)} only with --engine sim")
            return None
        if base_url:
            raise ValueError("--engine sim simulates the bundled engine: no --base-url")
        if self.cost_model not in (None, "calibrated", "roofline"):
            raise ValueError(
                f"--sim-cost-model {self.cost_model!r}: expected calibrated or roofline"
            )
        device = (self.device or "local").lower()
        peak = None
        if device != "local" or model or self.tensor_parallel_size > 1:
            from bench_cli.device_peak import local_sim_peak

            with console.status("measuring this machine's peaks (once a machine) ..."):
                peak = local_sim_peak()
        return simulation(
            quick, model, device, self.cost_model, self.profile, self.tensor_parallel_size, peak
        )

    def _sim_flags(self) -> dict[str, Any]:
        return {
            "--sim-device": self.device,
            "--sim-cost-model": self.cost_model,
            "--sim-profile": self.profile,
            "--tensor-parallel-size": self.tensor_parallel_size > 1,
        }


def _start(folder: Path, scale: Scale, claims: list[Claim], resuming: bool) -> dict[str, Any]:
    """claims.json as it stands: the thresholds every verdict will use, written before anything
    runs; on --resume, the findings so far (from a run at the same scale only), every claim's,
    not only those selected now, and the machine it started on."""
    record: dict[str, Any] = {
        "quick": scale.quick,
        "model": scale.model,
        "base_url": redact_url(scale.base_url) if scale.base_url else None,  # as resumed too
        "simulation": dataclasses.asdict(scale.sim) if scale.sim else None,
        "max_p99_lag_ms": scale.max_p99_lag_ms,  # judges the schedule: may change on --resume
        "thresholds": {c.id: c.thresholds for c in claims},
        "environment": environment(),
        "findings": {},
    }
    if resuming:
        try:
            before = json.loads((folder / "claims.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--resume {folder}: not a claims folder ({e})") from e
        keys = ("quick", "model", "base_url", "simulation")
        changed = [k for k in keys if before.get(k) != record[k]]
        if changed:
            raise ValueError(f"--resume {folder}: it ran with other {', '.join(changed)}")
        record["thresholds"] = before["thresholds"] | record["thresholds"]
        record["resumed"] = [*before.get("resumed", []), record["environment"]]
        record["environment"] = before["environment"]
        record["findings"] = before["findings"]
    write_json(folder / "claims.json", record)
    return record


@dataclass(frozen=True, slots=True)
class Failed:
    """A claim its sweep or judge could not measure: shown, not kept as done."""

    finding: Finding


def _run_claim(
    claim: Claim, scale: Scale, folder: Path, dashboard: bool, console: Console
) -> Finding | Failed | int:
    """The claim's finding, a failure to measure it, or the exit code of a sweep that was
    interrupted."""
    from bench_cli.sweep.options import SweepOptions
    from bench_cli.sweep.runner import run_sweep

    if claim.missing:
        return unmeasurable(claim.missing)
    if scale.sim is not None and claim.not_simulated:
        return unmeasurable(f"not simulated: {claim.not_simulated}")
    if scale.sim is None and claim.only_simulated:
        return unmeasurable(f"{claim.only_simulated} (--engine sim simulates it)")
    if scale.base_url and not claim.about_server:
        return unmeasurable("it sets engine settings: run it on the bundled engine (no --base-url)")
    assert claim.sweep is not None and claim.judge is not None
    folder.mkdir(parents=True, exist_ok=True)
    measured = folder / "measured.json"
    sweep_dir = folder / "sweep"
    try:
        if claim.measure is not None and not measured.is_file():
            with console.status(f"claim {claim.id}: measuring ..."):
                write_json(measured, claim.measure(scale))
        resume = str(sweep_dir) if (sweep_dir / "sweep.json").is_file() else None
        flags = {"out": str(sweep_dir), "name": claim.slug}
        options = SweepOptions(resume=resume, dashboard=dashboard)
        code = run_sweep(claim.sweep(scale), flags, options, console)
        if code >= 128:  # interrupted (128 + the signal)
            return code
        if code == INVALID_EXIT:
            return Failed(unmeasurable(INVALID_SWEEP.format(sweep_dir)))
        if code != 0:
            return Failed(unmeasurable(f"its sweep failed (exit {code}): see {sweep_dir}"))
        return claim.judge(read_sweep(sweep_dir), scale, folder)
    except Exception as e:  # one claim's failure must not lose the others' results
        return Failed(unmeasurable(f"it failed: {type(e).__name__}: {e} (see {folder})"))
