"""Webhook subscriptions of an organization: create, find, list, delete."""

import secrets

from errors import ApiError, ValidationError, field_error
from models import Organization, Subscription, is_sqlite, new_id, write_transaction
from pagination import keyset_page

MAX_SUBSCRIPTIONS = 100
SECRET_PREFIX = "whsec_"


def create_subscription(org: Organization, url: str, description: str | None,
                        now_ms: int) -> Subscription:
    """Store a subscription with a fresh signing secret; the URL must already be vetted."""
    with write_transaction():
        if not is_sqlite():
            # Serialize creates per organization so the cap holds under concurrency.
            Organization.select().where(Organization.id == org.id).for_update().execute()
        if Subscription.select().where(Subscription.organization == org).count() >= MAX_SUBSCRIPTIONS:
            raise ValidationError([field_error(None, "too_many_subscriptions",
                                               f"An organization has at most {MAX_SUBSCRIPTIONS} subscriptions.")])
        return Subscription.create(
            id=new_id("wh"), organization=org, url=url, description=description,
            secret=SECRET_PREFIX + secrets.token_urlsafe(32), created_at=now_ms)


def find_subscription(org: Organization, subscription_id: str) -> Subscription:
    """The organization's subscription, or 404: another organization's is indistinguishable from none."""
    subscription = Subscription.get_or_none(
        (Subscription.id == subscription_id) & (Subscription.organization == org))
    if subscription is None:
        raise ApiError(404, "not_found", "No such subscription.")
    return subscription


def list_subscriptions(org: Organization, position: list | None, limit: int):
    """A page of the organization's subscriptions, oldest first, and the next position."""
    query = Subscription.select().where(Subscription.organization == org)
    return keyset_page(query, (Subscription.created_at, Subscription.id), position, limit,
                       newest_first=False)


def delete_subscription(subscription: Subscription) -> None:
    """Delete it with its events, deliveries and failures, so nothing more is sent to it."""
    with write_transaction():
        subscription.delete_instance()
