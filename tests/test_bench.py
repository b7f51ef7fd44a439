"""The benches in their short mode (BENCH_QUICK=1), so they cannot rot: each runs against a real
gunicorn and reports its figures. How fast the service is, is the benches' business, not this test's.

Without wrk, api_overhead falls back to a Python load generator in quick mode (its figures then say
nothing about the service, but the bench still runs end to end).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = {"api_overhead", "ping_latency", "delivery_throughput", "isolation", "dns_isolation", "state_scale",
           "memory", "soak", "noisy_neighbour", "order"}
QUICK_SECONDS = 150


def test_every_bench_runs_in_quick_mode_and_reports_its_figures(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PARTNER_", "BENCH_"))}
    env.update(BENCH_QUICK="1", BENCH_RESULTS_DIR=str(tmp_path))
    log = tmp_path / "run_all.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "bench/run_all.py"], cwd=ROOT, env=env,
                                   stdout=output, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait(timeout=QUICK_SECONDS)
        finally:
            if process.poll() is None:
                process.terminate()  # run_all stops its bench, which stops its servers
                process.wait(timeout=60)
    assert returncode == 0, log.read_text()[-8000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "quick" and summary["failed"] == {}
    assert summary["machine"]["cores"] > 0 and summary["machine"]["memory_gib"] > 0
    assert set(summary["benches"]) == BENCHES
    for name, result in summary["benches"].items():
        assert (tmp_path / f"{name}.json").exists()
        targets = [figure for figure in result["figures"] if figure["target"]]
        assert targets, f"{name} reports no figure against a target"
        for figure in result["figures"]:
            assert isinstance(figure["value"], (int, float)) and math.isfinite(figure["value"]), figure
            assert figure["value"] >= 0, figure
        for figure in targets:
            assert figure["value"] > 0 and isinstance(figure["passed"], bool), figure
