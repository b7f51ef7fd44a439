"""order: a backlog of pings to one subscription, all due at once, arrives in the order it was queued.

EVENTS test pings are queued to one subscription through the API with the scheduler off (so all are
due when it starts), then the service starts with it on, at the default settings, and drains them
into an endpoint answering after RESPONSE_MS. Figures: inversions (pairs that arrived in the wrong
order), and the drain time against EVENTS x RESPONSE_MS (one attempt in flight per subscription, so
that is the least it can take).
"""

from harness import Partner, Receiver, Service, at_least, at_most, info, pick, report, workdir

EVENTS = pick(500, 100)
RESPONSE_MS = 50


def inversions(order: list[int]) -> int:
    """Pairs out of order, by merge sort: O(n log n)."""
    if len(order) < 2:
        return 0
    middle = len(order) // 2
    left, right = sorted(order[:middle]), sorted(order[middle:])
    count, j = inversions(order[:middle]) + inversions(order[middle:]), 0
    for value in left:
        while j < len(right) and right[j] < value:
            j += 1
        count += j
    return count


def main() -> dict:
    with workdir("order") as tmp, Receiver() as receiver:
        database = tmp / "order.sqlite3"
        quiet = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false"}, name="enqueue", database=database)
        key = quiet.create_key()
        with quiet:
            partner = Partner(quiet, key)
            subscription = partner.subscribe(receiver.url(f"/slow/{RESPONSE_MS}/one"))
            queued = [partner.ping(subscription) for _ in range(EVENTS)]
            partner.close()
        with Service(tmp, name="drain", database=database):
            drained = receiver.wait_for_count(EVENTS, EVENTS * RESPONSE_MS / 1000 * 3 + 30)
        arrivals = sorted(receiver.arrivals.items(), key=lambda item: item[1][1])
    if not drained:
        raise RuntimeError(f"only {len(arrivals)} of {EVENTS} deliveries arrived")
    position = {event_id: n for n, event_id in enumerate(queued)}
    order = [position[event_id] for event_id, _ in arrivals]
    seconds = arrivals[-1][1][1] - arrivals[0][1][1] + RESPONSE_MS / 1000
    least = EVENTS * RESPONSE_MS / 1000
    inverted, pairs = inversions(order), EVENTS * (EVENTS - 1) // 2
    figures = [
        at_least("share of pairs in queue order at the receiver", 1 - inverted / pairs, "", 1.0),
        info("inversions at the receiver", inverted, "pairs"),
        info("events out of place", sum(1 for n, queued_at in enumerate(order) if n != queued_at), "events"),
        at_most(f"drain time / ({EVENTS} x {RESPONSE_MS} ms)", seconds / least, "", 1.2),
        info("drain time", seconds, "s"),
    ]
    return report("order", figures, {"events": EVENTS, "response_ms": RESPONSE_MS})


if __name__ == "__main__":
    main()
