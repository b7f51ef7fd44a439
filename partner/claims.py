"""What a claim is, and which due deliveries a claim picks, by the queue's rules (partner/queue.py).
The claim itself, one write transaction that takes the picked deliveries under a lease, is
partner/outbox.py's."""

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from partner import queue
from partner.outbound.transport import AttemptResult
from partner.store.sql import select_rows


@dataclass(frozen=True)
class Claim:
    """One claimed delivery: everything an attempt needs, read once at claim time."""
    event_id: str
    kind: str
    body: bytes
    attempt: int
    lease_token: str
    subscription_id: str
    organization_id: str
    url: str
    secret: str = field(repr=False)  # a repr may reach a log line or a traceback
    failing: bool = False  # when claimed, the subscription's last attempt had failed: a failing slot
    may_widen: bool = False  # this claim filled its subscription's adaptive limit, below the most (outbox._filled)
    queued_at: int = 0  # when its event was accepted (Unix ms): the lag to its first attempt is measured
    beyond: bool = False  # given a thread beyond the spare slots: its organization was below its share
    # When the lease began, on time.monotonic: the outcome must be written before it ends.
    claimed_at: float = field(default_factory=time.monotonic)

    @property
    def delivery(self) -> tuple[str, str]:
        """The delivery's key: (event id, subscription id)."""
        return self.event_id, self.subscription_id


# Attempts whose outcome could not be written (their lease expired first) before the delivery is
# dead-lettered with this result instead of being sent again.
MAX_UNRECORDED = 3
NEVER_RECORDED = AttemptResult(False, None, "not_recorded", "", 0,
                               f"{MAX_UNRECORDED} attempts were made whose outcome could never be written")


class Pick(NamedTuple):
    """A delivery chosen to claim, how many its subscription could be given now (its room), and
    whether it was given a slot beyond the spare ones (its organization below its share)."""
    event_id: str
    subscription_id: str
    room: int
    beyond: bool


def pick_due(now_ms: int, limit: int, failing_limit: int | None, most: int, slots: int | None = None,
             spare: int | None = None) -> list[Pick]:
    """Up to `limit` deliveries to claim now, in turn order, of which only `spare` (None: all) may go to
    an organization beyond its share of the process's `slots` (None: `limit`); see partner/queue.py.
    `most`: the most attempts in flight to one subscription."""
    params = {"now_ms": now_ms, "limit": limit, "most": most, "slots": limit if slots is None else slots,
              "spare": limit if spare is None else spare,
              "failing_limit": limit if failing_limit is None else failing_limit}
    return [Pick(row["event_id"], row["subscription_id"], row["room"], bool(row["beyond"]))
            for row in select_rows(queue.PICK, params)]


def any_due(now_ms: int) -> bool:
    """Whether a delivery of a subscription not deleted nor held is due. Asked after a claim that took
    nothing: then each waits behind attempts in flight (its subscription at its limit), or another
    process's claim took it first."""
    return bool(select_rows(queue.ANY_DUE, {"now_ms": now_ms}))


def next_due_at(now_ms: int) -> int | None:
    """When the next open delivery falls due after `now_ms` (a retry, a lease ending) or the next
    Retry-After hold ends; None if none will. Deleted subscriptions' deliveries count too: a wake-up
    for one costs a scan that takes nothing, and leaving them out would search what the purge has
    yet to remove."""
    [row] = select_rows(queue.NEXT_DUE, {"now_ms": now_ms})
    return row["due_at"]
