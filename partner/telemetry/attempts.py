"""What the operator sees of each delivery attempt: one log line (docs/operations.md) and its metrics.
(Dead letters and auto-disables have lines of their own: partner/dead_letters.py.)

The line is logged as the dispatcher's (logger `delivery`): operators filter on that name."""

import json
import logging

from partner.telemetry import metrics

log = logging.getLogger("delivery")


def log_attempt(outcome, recorded) -> None:
    """One line per attempt (an outcomes.Outcome and what was Recorded of it), and its metrics. The fields appear twice: in the text line, and as
    JSON keys under PARTNER_LOG_FORMAT=json."""
    claim, result, finished_at = outcome.claim, outcome.result, outcome.finished_at
    what = result.error or "delivered"  # the `outcome` of the log line and the metric
    metrics.count_attempt(claim.kind, what, result.duration_ms / 1000)
    next_at = recorded.next_attempt_at
    fields = {"event_id": claim.event_id, "subscription_id": claim.subscription_id,
              "attempt": claim.attempt, "outcome": what, "status": result.http_status,
              "duration_ms": result.duration_ms,
              "next_attempt_in_ms": next_at - finished_at if next_at else None,
              "recorded": recorded.recorded, "error_detail": result.error_detail}
    # The detail last and quoted: it has spaces, and a JSON string keeps any quote inside it apart.
    log.info("delivery event=%(event_id)s subscription=%(subscription_id)s attempt=%(attempt)d "
             "outcome=%(outcome)s http_status=%(status)s duration_ms=%(duration_ms)d "
             "next_attempt_in_ms=%(next_attempt_in_ms)s recorded=%(recorded)s error_detail=%(quoted)s",
             {**fields, "quoted": result.error_detail and json.dumps(result.error_detail, ensure_ascii=False)},
             extra=fields)
