"""writer_turns: how much of the time SQLite's one writer is in use when two processes take turns at
it, through the service's own lock file (partner/writers.py), as two workers do.

Each process loops: take the turn, hold it HOLD busy (a write transaction), give it back, work half
as long (an attempt), again. The writer can be in use at most all of the time; what is missing is
the gap between one turn ending and the next starting: the waiter is asleep between tries of the
lock. Also: the CPU a process spends waiting while another holds the turn for a long time (a
backup, migrations at start-up).
"""

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from harness import SERVICE_ROOT, at_least, info, pick, report

sys.path.insert(0, str(SERVICE_ROOT))
from partner import writers  # noqa: E402  (the service's, from SERVICE_ROOT)

SECONDS = pick(3, 1)
HOLDS_MS = (0.5, 1, 2)
LONG_WAIT = pick(3, 1)  # seconds


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def take_turns(path: str, hold: float) -> int:
    count, end = 0, time.monotonic() + SECONDS
    while time.monotonic() < end:
        with writers.turn(path):
            busy(hold)
        count += 1
        busy(hold / 2)
    return count


def hold_long(path: str, holding) -> None:
    with writers.turn(path):
        holding.set()
        time.sleep(LONG_WAIT)


def writer_in_use(path: str, hold: float) -> float:
    with multiprocessing.Pool(2) as pool:
        return sum(pool.starmap(take_turns, [(path, hold)] * 2)) * hold / SECONDS


def cpu_while_waiting(path: str) -> float:
    holding = multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_long, args=(path, holding))
    holder.start()
    holding.wait()
    started, waited_from = time.process_time(), time.monotonic()
    with writers.turn(path):
        pass
    cpu, waited = time.process_time() - started, time.monotonic() - waited_from
    holder.join()
    return cpu / waited


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="writer-turns-") as tmp:
        path = str(Path(tmp) / "partner.sqlite3")
        Path(path).touch()
        in_use = {hold: writer_in_use(path, hold / 1000) for hold in HOLDS_MS}
        waiting = cpu_while_waiting(path)
    figures = [at_least(f"writer in use, 2 processes, {hold:g} ms turns", share, "of the time", 0.8)
               for hold, share in in_use.items()]
    figures.append(info("CPU of a process waiting for a long turn", waiting, "of a core"))
    return report("writer_turns", figures, {"seconds": SECONDS, "long_wait_seconds": LONG_WAIT})


if __name__ == "__main__":
    main()
