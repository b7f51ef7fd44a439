"""The dispatcher's background jobs, on APScheduler: the scan for due deliveries, run every poll
interval and sooner on demand (`run_soon`), one run at a time; and retention's (partner/retention.py).
Nothing is scheduled until `start()`: gunicorn's worker hook starts the dispatcher, which starts these."""

import threading
from datetime import datetime, timedelta, timezone

from apscheduler.schedulers.background import BackgroundScheduler

from partner import retention

SCAN_JOB = "scan-due-deliveries"
# Runs of the scan job APScheduler may have under way at once: more than can ever be, since each run
# that finds another under way returns at once (Jobs._scheduled_scan).
JOB_INSTANCES = 100


class Jobs:
    """The scheduler running `scan` every `poll_interval` seconds, and retention's jobs."""

    def __init__(self, scan, poll_interval: float, clock, retention_days: int):
        self._scan, self.poll_interval = scan, poll_interval
        self._clock, self._retention_days = clock, retention_days
        self._scheduler: BackgroundScheduler | None = None
        self._scheduling_lock = threading.Lock()
        self._job_lock = threading.Lock()  # guards the two flags below
        self._job_running = False  # the scan job is under way
        self._job_again = False  # it was due again meanwhile: it scans once more before it ends

    @property
    def running(self) -> bool:
        return bool(self._scheduler and self._scheduler.running)

    def start(self) -> None:
        with self._scheduling_lock:  # a scan that moves a job waits until every job is scheduled
            self._scheduler = BackgroundScheduler(timezone=timezone.utc)
            # A run that finds another under way returns at once (_scheduled_scan): APScheduler's own
            # limit, which drops a run with a warning each time, is set out of its reach.
            self._scheduler.add_job(self._scheduled_scan, "interval", seconds=self.poll_interval, id=SCAN_JOB,
                                    max_instances=JOB_INSTANCES, coalesce=True, next_run_time=_utcnow())
            retention.schedule(self._scheduler, self._clock, self._retention_days)
            self._scheduler.start()

    def stop(self) -> None:
        """Stop scheduling, and wait for the jobs under way."""
        # Under the lock, so that no scan is inside the scheduler moving a job while shutdown (which
        # holds the scheduler's own lock) waits for that scan to end.
        with self._scheduling_lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler:
            scheduler.shutdown(wait=True)

    def run_soon(self, job: str, seconds: float = 0) -> None:
        """Run `job` in `seconds`, unless it is due by then already: a later time never puts off a
        wake or a poll. A run already overdue is moved too: the scheduler drops one late by over a
        second (its misfire grace time). Nothing while the jobs are not running."""
        now = _utcnow()
        at = now + timedelta(seconds=seconds)
        with self._scheduling_lock:  # no other call moves it between the read and the move
            scheduler = self._scheduler
            current = scheduler.get_job(job) if scheduler else None
            if current and not (current.next_run_time and now <= current.next_run_time <= at):
                scheduler.modify_job(job, next_run_time=at)

    def _scheduled_scan(self) -> None:
        """The scan job (a poll, a wake, a retry falling due), one run at a time. A run due while
        another is under way does not scan beside it: it asks that one to scan once more before it
        ends, so a wake during a scan is never lost, and returns. Letting APScheduler refuse the extra
        runs instead made it log a warning for each: about 30 a minute under steady pings."""
        with self._job_lock:
            if self._job_running:
                self._job_again = True
                return
            self._job_running = True
        try:
            while True:
                self._scan()
                with self._job_lock:  # decided and marked together: a wake cannot fall between
                    if not self._job_again:
                        self._job_running = False
                        return
                    self._job_again = False
        except BaseException:
            with self._job_lock:
                self._job_running = False
            raise


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)
