"""subscriptions.py on the real database file: the hand-written list pages use their keyset index."""

import pytest

from partner.keys import create_key
from models import db
from partner.subscriptions import create_subscription, list_subscriptions
from tests.support import query_plan


@pytest.fixture
def org(app):
    with app.app_context(), db.connection_context():
        yield create_key("acme", ["webhooks:manage"], 1).key.organization


@pytest.mark.parametrize("position", [None, [5, "wh_zzzzzzzzzzzzzzzzzzzz"]], ids=["first", "next"])
def test_a_subscriptions_page_uses_its_keyset_index(org, position):
    for created_at in range(10):
        create_subscription(org.id, "https://93.184.215.14/hook", None, created_at)
    plan = query_plan(db, lambda: list_subscriptions(org.id, position, 3))
    assert "subscription_organization_id_created_at_id" in plan
    assert "TEMP B-TREE" not in plan  # ordered by the index, not sorted afterwards


def test_pages_follow_each_other_in_creation_order(org):
    made = [create_subscription(org.id, "https://93.184.215.14/hook", None, 7).id for _ in range(5)]
    first, position = list_subscriptions(org.id, None, 3)
    second, end = list_subscriptions(org.id, position, 3)
    assert [row["id"] for row in first + second] == sorted(made) and end is None
