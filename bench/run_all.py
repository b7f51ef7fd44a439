"""Run every bench, each in its own process, then print one combined table and write
bench/results/summary.json. `BENCH_QUICK=1` runs the short mode of each; `BENCH_ONLY=a,b` a subset.
Exits non-zero if a bench failed to produce its figures (a missed target is a figure, not a failure).
"""

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

from harness import BENCH_DIR, QUICK, RESULTS_DIR, fmt, machine, table, wait_or_kill
from soak import MINUTES as SOAK_MINUTES

BENCHES = ["api_overhead", "ping_latency", "delivery_throughput", "engine_cpu", "isolation", "dns_isolation",
           "fairness", "descriptor_attack", "request_threads", "concurrency", "scale_out", "data_costs", "ops_hammer",
           "state_scale", "memory", "publish", "soak"]
TIME_LIMIT = 60 if QUICK else 600  # seconds per bench, beyond the soak's own duration


def time_limit(bench: str) -> float:
    """The soak runs for BENCH_SOAK_MINUTES (30 by default): its limit starts after that."""
    return TIME_LIMIT + (SOAK_MINUTES * 60 if bench == "soak" else 0)


def run(bench: str) -> tuple[dict | None, float, str]:
    result_path = RESULTS_DIR / f"{bench}.json"
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(BENCH_DIR / f"{bench}.py")])
    try:
        returncode = process.wait(timeout=time_limit(bench))
        error = "" if returncode == 0 else f"exited with {returncode}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {time_limit(bench):.0f} s"
    finally:
        stop(process)  # on a timeout, or when run_all itself is stopped
    seconds = time.monotonic() - started
    if error or not result_path.exists():
        return None, seconds, error or "wrote no result"
    return json.loads(result_path.read_text()), seconds, ""


def stop(process: subprocess.Popen) -> None:
    """SIGTERM first, so the bench stops the servers it started; SIGKILL if it does not end."""
    if process.poll() is None:
        process.terminate()
        wait_or_kill(process)


def main() -> int:
    only = [name for name in os.environ.get("BENCH_ONLY", "").split(",") if name]
    benches = [name for name in BENCHES if not only or name in only]
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results, failed = {}, {}
    for bench in benches:
        result, seconds, error = run(bench)
        if result is None:
            failed[bench] = error
            print(f"\n!! {bench}: {error}", file=sys.stderr)
        else:
            result["seconds"] = round(seconds, 1)
            results[bench] = result
    m = machine()
    rows = []
    for bench, result in results.items():
        for figure in result["figures"]:
            verdict = "" if figure["passed"] is None else ("PASS" if figure["passed"] else "MISS")
            rows.append([bench, figure["name"], fmt(figure["value"]), figure["unit"], figure["target"],
                         verdict])
    for bench, error in failed.items():
        rows.append([bench, f"FAILED: {error}", "", "", "", ""])
    print(f"\n== all benches ({'quick' if QUICK else 'full'} mode) — {started_at} — {m['cores']} cores, "
          f"{m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, SQLite {m['sqlite']}")
    print(table(rows, ["bench", "figure", "value", "unit", "target", ""]))
    summary = {"mode": "quick" if QUICK else "full", "date": started_at, "machine": m,
               "benches": results, "failed": failed}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
