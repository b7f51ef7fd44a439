"""Webhook subscriptions: an organization's (create, find, list, delete) and the operator's
(an overview with delivery counts, re-enabling after an auto-disable, pinning its concurrency)."""

import base64
import json
import secrets

from peewee import fn

from models import Delivery, Organization, Subscription
from partner import event_types, queue, safe_text, sealing
from partner.store.sql import is_sqlite, new_id, page_of, run_sql, select_rows, write_transaction
from partner.validation import Check, Field
from partner.errors import ApiError, OperatorError, ValidationError, field_error
from partner.outbound import ssrf

# Every list request runs one of these, so they are written once as SQL: compiling the ORM query
# cost more than running it (bench/api_overhead). Keyset order over the index on
# (organization_id, created_at, id); portable, run by database.select_rows.
_PAGE_COLUMNS = ("SELECT id, url, description, events, active, consecutive_failures, auto_disabled_at, created_at "
                 "FROM subscription WHERE organization_id = :organization_id AND deleted_at IS NULL")
_FIRST_PAGE = _PAGE_COLUMNS + " ORDER BY created_at, id LIMIT :limit"
_NEXT_PAGE = _PAGE_COLUMNS + " AND (created_at, id) > (:after_created_at, :after_id) ORDER BY created_at, id LIMIT :limit"

# A deleted subscription keeps its row (a tombstone) until retention.purge_deleted removes it with
# its history in short batches; every query here passes over it.
LIVE = Subscription.deleted_at.is_null()
# Frees its in-flight attempt's lease, so an outcome arriving after the delete records nothing.
_DROP_LEASES = f"UPDATE delivery SET lease_token = NULL WHERE subscription_id = :subscription_id AND {queue.IN_FLIGHT}"

MAX_SUBSCRIPTIONS = 100
MAX_DESCRIPTION_LENGTH = 255
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A signing secret: 'whsec_' and the standard base64 of 32 random bytes (44 characters, padded),
    so the same string is the X-VC-Signature key and, decoded, the Standard Webhooks one."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def subscription_fields(resolve: ssrf.Resolver, allowed_networks) -> tuple[Field, ...]:
    """The fields of a subscription definition; the URL is vetted with `resolve`."""
    return (Field("url", required=True, max_length=ssrf.MAX_URL_LENGTH,
                  check=target_check(resolve, allowed_networks)),
            Field("description", max_length=MAX_DESCRIPTION_LENGTH, check=plain_label),
            Field("events", kind=list, check=event_types.check_filter))


def plain_label(text: str) -> tuple[str, str] | None:
    """Refuse control and bidi control characters, naming the first (safe_text.unfit_for_a_label)."""
    unfit = safe_text.unfit_for_a_label(text)
    if unfit is not None:
        return "invalid_type", (f"This field must be plain text: {safe_text.character_name(unfit)} is a control "
                                f"or bidi formatting character (tab and newline are allowed).")
    return None


def target_check(resolve: ssrf.Resolver, allowed_networks) -> Check:
    """The SSRF guard's verdict on a URL, as a field error."""
    def check(url: str) -> tuple[str, str] | None:
        try:
            ssrf.check_url(url, resolve, allowed_networks)
        except ssrf.UnsafeUrl as error:
            # A name that does not resolve now (or not in time) cannot be vetted, so it is as
            # invalid as a malformed URL.
            code = "invalid_url" if error.code in ("unresolvable", "lookup_timeout") else error.code
            return code, error.message
        return None
    return check


def create_subscription(org_id: str, url: str, description: str | None, now_ms: int,
                        events: list[str] | None = None) -> Subscription:
    """Store a subscription with a fresh signing secret; the URL (and `events`, its filter) must
    already be vetted."""
    with write_transaction():
        if not is_sqlite():
            # Serialize creates per organization so the cap holds under concurrency.
            Organization.select().where(Organization.id == org_id).for_update().execute()
        if Subscription.select().where((Subscription.organization == org_id) & LIVE).count() >= MAX_SUBSCRIPTIONS:
            raise ValidationError([field_error(None, "too_many_subscriptions",
                                               f"An organization has at most {MAX_SUBSCRIPTIONS} subscriptions.")])
        subscription_id = new_id("wh")
        secret_key_id, secret_sealed = sealing.seal(subscription_id, new_secret())
        return Subscription.create(
            id=subscription_id, organization=org_id, url=url, description=description, secret_key_id=secret_key_id,
            secret_sealed=secret_sealed, created_at=now_ms, events=None if events is None else json.dumps(events))


def secret_of(subscription: Subscription) -> str:
    """The subscription's signing secret, opened: held in memory only, never stored in plaintext."""
    return sealing.open_secret(subscription.id, subscription.secret_key_id, subscription.secret_sealed)


def find_subscription(org_id: str, subscription_id: str, lock: bool = False) -> Subscription:
    """The organization's subscription, or 404: another organization's is indistinguishable from none.
    `lock`: on PostgreSQL, keep it as found until the caller's transaction ends (FOR SHARE): a delete,
    purge or auto-disable committing meanwhile waits, and one that committed first is seen (on
    SQLite, the caller's write transaction already excludes them)."""
    # An id with a control character was never issued, and PostgreSQL refuses NUL in a query.
    query = Subscription.select().where(
        (Subscription.id == subscription_id) & (Subscription.organization == org_id) & LIVE)
    if lock and not is_sqlite():
        query = query.for_update("FOR SHARE")
    subscription = None if safe_text.has_controls(subscription_id) else query.first()
    if subscription is None:
        raise ApiError(404, "not_found", "No such subscription.")
    return subscription


def list_subscriptions(org_id: str, position: list | None, limit: int):
    """A page of the organization's subscriptions (rows by name), oldest first, and the next position."""
    page = {"organization_id": org_id, "limit": limit + 1}
    if position is None:
        rows = select_rows(_FIRST_PAGE, page)
    else:
        after_created_at, after_id = position
        rows = select_rows(_NEXT_PAGE, {**page, "after_created_at": after_created_at, "after_id": after_id})
    return page_of(rows, limit, ["created_at", "id"])


def delete_subscription(subscription: Subscription, now_ms: int) -> None:
    """Delete it at once for the partner (404, not listed, nothing more sent) in one short write;
    its events, deliveries and failures go later, in batches (retention.purge_deleted). The delivery
    in flight is locked before the subscription, as recording its outcome does (outbox): in the other
    order each waits for the other, and PostgreSQL rolls one back as a deadlock. On PostgreSQL a claim
    under way holds the subscription, and the update waits for it (why: outbox's module docstring)."""
    with write_transaction():
        run_sql(_DROP_LEASES, {"subscription_id": subscription.id})
        Subscription.update(deleted_at=now_ms).where((Subscription.id == subscription.id) & LIVE).execute()


def subscriptions_overview(slug: str | None = None, disabled_only: bool = False) -> list[Subscription]:
    """Every subscription (of one organization), each with `pending` (open) and `dead` counts,
    counted on the (subscription_id, state) index."""
    def count(states):
        return (Delivery.select(fn.COUNT(Delivery.event))
                .where((Delivery.subscription == Subscription.id) & Delivery.state.in_(states)))
    query = (Subscription.select(Subscription, Organization, count((Delivery.PENDING, Delivery.IN_FLIGHT)).alias("pending"),
                                 count((Delivery.DEAD,)).alias("dead"))
             .join(Organization).where(LIVE).order_by(Organization.slug, Subscription.created_at, Subscription.id))
    if slug:
        query = query.where(Organization.slug == slug)
    if disabled_only:
        query = query.where(Subscription.active == False)  # noqa: E712 (peewee builds SQL from ==)
    return list(query)


def set_concurrency(subscription_id: str, pin: int | None) -> Subscription:
    """Pin the most attempts in flight to the subscription at `pin` (1: one at a time, in order), or
    with None make it adaptive again, from 1 as a new subscription starts (partner/concurrency.py)."""
    changes = {Subscription.concurrency_pin: pin} if pin is not None else {
        Subscription.concurrency_pin: None, Subscription.concurrency_limit: 1, Subscription.concurrency_ceiling: None}
    with write_transaction():
        updated = Subscription.update(changes).where((Subscription.id == subscription_id) & LIVE).execute()
    if not updated:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return Subscription.get_by_id(subscription_id)


def enable_subscription(subscription_id: str) -> Subscription:
    """Re-enable an auto-disabled subscription with a clean failure streak. Its dead letters stay
    dead: enabling resends nothing (see replay_dead_letters)."""
    with write_transaction():
        updated = (Subscription.update(active=True, auto_disabled_at=None, consecutive_failures=0, paused_until=None)
                   .where((Subscription.id == subscription_id) & LIVE).execute())
    if not updated:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return Subscription.get_by_id(subscription_id)
