"""Release 1.1's schema (baseline.sql): brings a release 1.0 or 1.1 database, made before schema
versions existed, to the baseline every later migration starts from (1.0 lacked one index)."""
from pathlib import Path

from partner.store.migrations import schema_statements


def up(migrator, db):
    for statement in schema_statements(Path(__file__).with_name("baseline.sql").read_text()):
        db.execute_sql(statement)
