"""Organizations as the operator sees them: each one's budget, keys, subscriptions and deliveries, and
the one way to change a budget. Organizations are made by their first key (keys.create_key)."""

from dataclasses import astuple, dataclass

from peewee import fn

from models import ApiKey, Delivery, Organization, Subscription
from partner.store.sql import write_transaction
from partner.errors import OperatorError
from partner.keys import MAX_RATE_LIMIT
from partner.subscriptions import LIVE


@dataclass(frozen=True)
class OrganizationOverview:
    slug: str
    rate_limit_per_minute: int
    active_keys: int
    subscriptions: int
    pending: int  # open deliveries: pending or in flight
    dead: int

    def row(self) -> tuple:
        return astuple(self)


def list_organizations() -> list[OrganizationOverview]:
    """Every organization by slug, with its active keys, its subscriptions (deleted ones left out)
    and their open and dead deliveries."""
    def deliveries(*states):
        return (Delivery.select(fn.COUNT(Delivery.event)).join(Subscription)
                .where((Subscription.organization == Organization.id) & LIVE & Delivery.state.in_(states)))
    active_keys = ApiKey.select(fn.COUNT(ApiKey.key_id)).where(
        (ApiKey.organization == Organization.id) & ApiKey.revoked_at.is_null())
    subscriptions = Subscription.select(fn.COUNT(Subscription.id)).where(
        (Subscription.organization == Organization.id) & LIVE)
    query = Organization.select(Organization.slug, Organization.rate_limit_per_minute, active_keys,
                                subscriptions, deliveries(Delivery.PENDING, Delivery.IN_FLIGHT),
                                deliveries(Delivery.DEAD)).order_by(Organization.slug)
    return [OrganizationOverview(*row) for row in query.tuples()]


def set_rate_limit(slug: str, per_minute: int) -> None:
    """Give the organization `slug` a new per-minute budget. Every key reads it on its next request
    (keys.find_active_key reads the organization with the key, every request)."""
    if not 1 <= per_minute <= MAX_RATE_LIMIT:
        raise OperatorError(f"A rate limit is 1 to {MAX_RATE_LIMIT:,} requests per minute, not {per_minute}.")
    with write_transaction():
        updated = Organization.update(rate_limit_per_minute=per_minute).where(Organization.slug == slug).execute()
    if not updated:
        raise OperatorError(f"No organization {slug!r}.")
