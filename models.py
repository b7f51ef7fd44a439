"""The peewee models: mirrors of schema.sql (tests/test_models.py proves they agree), and nothing else."""

from peewee import (SQL, BigIntegerField, BlobField, BooleanField, CompositeKey, ForeignKeyField, IntegerField,
                    Model, ModelIndex, TextField)

from partner import queue
from partner.store.connection import db


class BytesField(BlobField):
    """Bytes in, bytes out on every database (psycopg2 reads BYTEA as a memoryview)."""

    def python_value(self, value):
        return None if value is None else bytes(value)


def default(sql: str) -> list:
    return [SQL(f"DEFAULT {sql}")]


class BaseModel(Model):
    class Meta:
        database = db
        legacy_table_names = False


class Organization(BaseModel):
    id = TextField(primary_key=True)
    slug = TextField(unique=True)
    rate_limit_per_minute = IntegerField(default=600, constraints=default("600"))
    created_at = BigIntegerField()


class ApiKey(BaseModel):
    key_id = TextField(primary_key=True)
    organization = ForeignKeyField(Organization, column_name="organization_id")
    secret_hash = TextField()
    scopes = TextField()  # space-separated, sorted
    created_at = BigIntegerField()
    revoked_at = BigIntegerField(null=True)

    @property
    def scope_set(self) -> set[str]:
        return set(self.scopes.split())


class Subscription(BaseModel):
    id = TextField(primary_key=True)
    organization = ForeignKeyField(Organization, column_name="organization_id", index=False)
    url = TextField()
    description = TextField(null=True)
    active = BooleanField(default=True, constraints=default("TRUE"))
    consecutive_failures = IntegerField(default=0, constraints=default("0"))
    auto_disabled_at = BigIntegerField(null=True)
    created_at = BigIntegerField()
    secret_key_id = TextField()
    secret_sealed = BytesField()
    deleted_at = BigIntegerField(null=True)
    concurrency_limit = IntegerField(default=1, constraints=default("1"))
    concurrency_ceiling = IntegerField(null=True)
    concurrency_pin = IntegerField(null=True)
    paused_until = BigIntegerField(null=True, index=True)
    events = TextField(null=True)  # the partner's filter, JSON (partner/event_types.py); null: every type

    class Meta:
        indexes = ((("organization", "created_at", "id"), False),)


class Event(BaseModel):
    id = TextField(primary_key=True)
    kind = TextField()
    body = BytesField(null=True)  # the whole envelope of an event queued before release 1.4
    created_at = BigIntegerField(index=True)
    occurred_at = BigIntegerField()
    data = BytesField()  # compact JSON; each delivery's envelope wraps these bytes (partner/envelopes.py)


class Delivery(BaseModel):
    PENDING, IN_FLIGHT, DELIVERED, DEAD = "pending", "in_flight", "delivered", "dead"

    event = ForeignKeyField(Event, column_name="event_id", index=False, on_delete="CASCADE")
    subscription = ForeignKeyField(Subscription, column_name="subscription_id", index=False,
                                   on_delete="CASCADE")
    state = TextField()
    attempts = IntegerField(default=0, constraints=default("0"))
    due_at = BigIntegerField(null=True)
    lease_token = TextField(null=True)
    seq = BigIntegerField(default=0, constraints=default("0"))
    unrecorded = IntegerField(default=0, constraints=default("0"))
    ended = TextField(null=True)  # why a dead letter ended, in words, with the figures of that moment

    class Meta:
        primary_key = CompositeKey("event", "subscription")


# The queue's conditions (partner/queue.py), repeated word for word by the partial indexes.
IS_OPEN, IS_IN_FLIGHT = SQL(queue.OPEN), SQL(queue.IN_FLIGHT)


Delivery.add_index(ModelIndex(Delivery, (Delivery.due_at,), name="delivery_due_at").where(IS_OPEN))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription,), name="delivery_in_flight")
                   .where(IS_IN_FLIGHT))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription, Delivery.due_at, Delivery.seq),
                              name="delivery_queue").where(IS_OPEN))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription, Delivery.state),
                              name="delivery_subscription_id_state"))


class Failure(BaseModel):
    id = TextField(primary_key=True)
    # Denormalized from the event so the audit's keyset index covers the query.
    subscription = ForeignKeyField(Subscription, column_name="subscription_id", index=False,
                                   on_delete="CASCADE")
    event = ForeignKeyField(Event, column_name="event_id", index=False, on_delete="CASCADE")
    attempt = IntegerField()
    http_status = IntegerField(null=True)
    error = TextField()
    response_excerpt = TextField()
    duration_ms = IntegerField()
    attempted_at = BigIntegerField()
    next_attempt_at = BigIntegerField(null=True)
    error_detail = TextField(null=True)

    class Meta:
        indexes = ((("subscription", "attempted_at", "id"), False),)


Failure.add_index(ModelIndex(Failure, (Failure.event, Failure.subscription), name="failure_event_id"))


class Setting(BaseModel):
    name = TextField(primary_key=True)
    value = TextField()


class Publisher(BaseModel):
    id = TextField(primary_key=True)
    name = TextField(unique=True)
    secret_hash = TextField()
    created_at = BigIntegerField()
    revoked_at = BigIntegerField(null=True)


class EventType(BaseModel):
    name = TextField(primary_key=True)
    description = TextField(null=True)
    schema = TextField(null=True)  # JSON Schema (draft 2020-12) of `data`, as text
    created_at = BigIntegerField()
    updated_at = BigIntegerField()
    retired_at = BigIntegerField(null=True)


class IdempotencyKey(BaseModel):
    publisher_id = TextField()
    key = TextField()
    request_hash = TextField()
    response = TextField(null=True)  # null while the first request with the key is being answered
    created_at = BigIntegerField(index=True)

    class Meta:
        primary_key = CompositeKey("publisher_id", "key")


MODELS = (Organization, ApiKey, Subscription, Event, Delivery, Failure, Setting, Publisher, EventType, IdempotencyKey)
