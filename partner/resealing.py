"""Sealed webhook secrets in the database: the start-up check that every one can be opened, and
re-sealing under the first configured key (`flask encryption rotate`)."""

import logging
import time
from dataclasses import dataclass

from partner import sealing
from partner.store.sql import is_sqlite, run_sql, write_transaction

log = logging.getLogger(__name__)

# Small batches: each is one short write transaction, so deliveries and API writes keep flowing.
ROTATE_BATCH = 50

# Waits for no row: one another transaction holds is left for a later pass. A batch of outcomes
# (outcomes.write_outcomes) locks its subscriptions in its own order, and a rotation that held some
# while it waited for another could wait in a cycle with it: PostgreSQL would roll one back.
_STALE = ("SELECT id, secret_key_id, secret_sealed FROM subscription "
          "WHERE secret_key_id <> :sealing_key_id AND id > :after_id ORDER BY id LIMIT :limit{lock}")
_STALE_IDS = "SELECT id FROM subscription WHERE secret_key_id <> :sealing_key_id"
# How long to wait before coming back for rows other transactions held: doubling from the first to
# the most (seconds), and said in the log at each wait of the most.
FIRST_HELD_PAUSE, MOST_HELD_PAUSE = 0.01, 1.0
_RESEAL = ("UPDATE subscription SET secret_key_id = :new_key_id, secret_sealed = :new_sealed "
           "WHERE id = :subscription_id AND secret_key_id = :old_key_id")


def check_stored_keys(database) -> None:
    """Raise SealingError naming the first stored key id that no configured key has. A database from
    before secrets were sealed (release 1.0, 1.1) has none."""
    if "secret_key_id" not in {column.name for column in database.get_columns("subscription")}:
        return
    ring = sealing.keyring()
    for (key_id,) in database.execute_sql("SELECT DISTINCT secret_key_id FROM subscription").fetchall():
        if key_id not in ring.ciphers:
            raise sealing.SealingError(f"webhook secrets are sealed under key id {key_id}, which "
                                       f"{ring.source} does not hold: add that key back")


@dataclass(frozen=True)
class Rotated:
    resealed: int
    key_id: str
    skipped: int = 0  # secrets that do not open (damaged, or under a key not configured): left as they were


def rotate(batch: int = ROTATE_BATCH) -> Rotated:
    """Re-seal every secret not sealed under the first key, `batch` rows per transaction, in passes
    over the ids until none is left but those that do not open. A row changed meanwhile (deleted,
    or re-sealed by another rotation) is skipped; one that does not open is logged, naming its
    subscription, once, and left as it was: one damaged row does not stop the others."""
    ring, resealed, pause = sealing.keyring(), 0, FIRST_HELD_PAUSE
    # The lock an UPDATE of these columns takes: inserting an event or a failure waits for none.
    lock = "" if is_sqlite() else " FOR NO KEY UPDATE SKIP LOCKED"
    unopened: set[str] = set()
    after = ""
    while True:
        with write_transaction():
            rows = run_sql(_STALE, {"sealing_key_id": ring.sealing_id, "after_id": after, "limit": batch},
                           lock=lock).fetchall()
            for subscription_id, key_id, sealed in rows:
                try:
                    secret = ring.open(subscription_id, key_id, sealed)
                except sealing.SealingError as error:
                    if subscription_id not in unopened:
                        unopened.add(subscription_id)
                        log.error("encryption rotate: %s: left sealed as it was", error)
                    continue
                new_key_id, new_sealed = ring.seal(subscription_id, secret)
                resealed += run_sql(_RESEAL, {"new_key_id": new_key_id, "new_sealed": new_sealed,
                                              "subscription_id": subscription_id, "old_key_id": key_id}).rowcount
        if len(rows) == batch:
            after = rows[-1][0]
            continue
        left = {row[0] for row in run_sql(_STALE_IDS, {"sealing_key_id": ring.sealing_id}).fetchall()} - unopened
        if not left:
            return Rotated(resealed, ring.sealing_id, len(unopened))
        if pause == MOST_HELD_PAUSE:  # not an attempt's few milliseconds: say what it waits for
            log.warning("encryption rotate: %d webhook secrets are in rows other transactions "
                        "hold; waiting for them", len(left))
        time.sleep(pause)
        pause = min(2 * pause, MOST_HELD_PAUSE)
        after = ""  # another pass, for the rows that were held
