"""Release 1.2: webhook signing secrets sealed at rest (partner/sealing.py). Two columns hold the
sealing key's id and the ciphertext; the plaintext column goes. On SQLite the NOT NULLs rebuild the
table (foreign keys off: see partner/migrations); the plaintext left in freed pages and the -wal is
scrubbed after the commit (partner.migrations.scrub)."""
from peewee import BlobField, TextField

from partner import sealing
from partner.store.sql import run_sql_on

SCRUB = True  # this migration removes secrets: the database is rewritten after it


class Bytea(BlobField):
    field_type = "BYTEA"  # schema.sql's portable name for the column's type


def up(migrator, db):
    migrator.migrate(migrator.add_column("subscription", "secret_key_id", TextField(null=True)),
                     migrator.add_column("subscription", "secret_sealed", Bytea(null=True)))
    for subscription_id, secret in db.execute_sql('SELECT id, secret FROM subscription').fetchall():
        key_id, sealed = sealing.seal(subscription_id, secret)
        run_sql_on(db, "UPDATE subscription SET secret_key_id = :key_id, secret_sealed = :sealed WHERE id = :subscription_id",
                   {"key_id": key_id, "sealed": sealed, "subscription_id": subscription_id})
    migrator.migrate(migrator.add_not_null("subscription", "secret_key_id"),
                     migrator.add_not_null("subscription", "secret_sealed"),
                     migrator.drop_column("subscription", "secret"))
