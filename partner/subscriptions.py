"""Webhook subscriptions of an organization: create, find, list, delete."""

import secrets

import outside_text
import ssrf
from errors import ApiError, ValidationError, field_error
from models import Organization, Subscription, is_sqlite, new_id, remembered, select_rows, write_transaction
from pagination import page_of
from validation import Check, Field

# Every list request runs one of these, so they are written once as SQL: compiling the ORM query
# cost more than running it (bench/api_overhead). Keyset order over the index on
# (organization_id, created_at, id); portable, run by models.select_rows.
_PAGE_COLUMNS = ("SELECT id, url, description, active, consecutive_failures, auto_disabled_at, created_at "
                 "FROM subscription WHERE organization_id = {p}")
_FIRST_PAGE = _PAGE_COLUMNS + " ORDER BY created_at, id LIMIT {p}"
_NEXT_PAGE = _PAGE_COLUMNS + " AND (created_at, id) > ({p}, {p}) ORDER BY created_at, id LIMIT {p}"

MAX_SUBSCRIPTIONS = 100
MAX_DESCRIPTION_LENGTH = 255
SECRET_PREFIX = "whsec_"


def subscription_fields(resolve: ssrf.Resolver, allowed_networks) -> tuple[Field, ...]:
    """The fields of a subscription definition; the URL is vetted with `resolve`."""
    return (Field("url", required=True, max_length=ssrf.MAX_URL_LENGTH,
                  check=target_check(resolve, allowed_networks)),
            Field("description", max_length=MAX_DESCRIPTION_LENGTH, check=no_controls))


def no_controls(text: str) -> tuple[str, str] | None:
    """Refuse NUL and other control characters (PostgreSQL cannot store NUL; none belongs in a label)."""
    if outside_text.has_controls(text):
        return "invalid_type", "This field must be text without control characters (tab and newline allowed)."
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


def create_subscription(org_id: str, url: str, description: str | None,
                        now_ms: int) -> Subscription:
    """Store a subscription with a fresh signing secret; the URL must already be vetted."""
    with write_transaction():
        if not is_sqlite():
            # Serialize creates per organization so the cap holds under concurrency.
            Organization.select().where(Organization.id == org_id).for_update().execute()
        if Subscription.select().where(Subscription.organization == org_id).count() >= MAX_SUBSCRIPTIONS:
            raise ValidationError([field_error(None, "too_many_subscriptions",
                                               f"An organization has at most {MAX_SUBSCRIPTIONS} subscriptions.")])
        return Subscription.create(
            id=new_id("wh"), organization=org_id, url=url, description=description,
            secret=SECRET_PREFIX + secrets.token_urlsafe(32), created_at=now_ms)


def find_subscription(org_id: str, subscription_id: str) -> Subscription:
    """The organization's subscription, or 404: another organization's is indistinguishable from none."""
    # An id with a control character was never issued, and PostgreSQL refuses NUL in a query.
    subscription = None if outside_text.has_controls(subscription_id) else Subscription.get_or_none(
        (Subscription.id == subscription_id) & (Subscription.organization == org_id))
    if subscription is None:
        raise ApiError(404, "not_found", "No such subscription.")
    return subscription


def list_subscriptions(org_id: str, position: list | None, limit: int):
    """A page of the organization's subscriptions (rows by name), oldest first, and the next position.
    First pages, which a partner reads again and again, are kept until the next commit."""
    if position is None:
        rows = remembered(("subscriptions", org_id, limit),
                          lambda: select_rows(_FIRST_PAGE, (org_id, limit + 1)), rows=limit + 1)
    else:
        rows = select_rows(_NEXT_PAGE, (org_id, *position, limit + 1))
    return page_of(rows, limit, ["created_at", "id"])


def delete_subscription(subscription: Subscription) -> None:
    """Delete it with its events, deliveries and failures, so nothing more is sent to it."""
    with write_transaction():
        subscription.delete_instance()
