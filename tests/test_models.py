"""schema.sql is the DDL authority; the peewee models must describe exactly the same database."""

import sqlite3

import pytest
from peewee import SqliteDatabase

import models
from partner.store import connection
from partner.store import migrations


def describe(path) -> dict:
    """Tables, columns, indexes and foreign keys of a SQLite file, as comparable data."""
    conn = sqlite3.connect(path)
    shape = {}
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    for table in tables:
        indexes = {}
        for _, name, unique, origin, partial in conn.execute(f'PRAGMA index_list("{table}")'):
            columns = [r[2] for r in conn.execute(f'PRAGMA index_info("{name}")')]
            where = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            clause = where[0].split(" WHERE ", 1)[1] if where and where[0] and partial else None
            indexes[name] = (unique, origin, columns, clause)
        shape[table] = {
            "columns": conn.execute(f'PRAGMA table_info("{table}")').fetchall(),
            "indexes": indexes,
            "foreign_keys": sorted(r[2:] for r in conn.execute(f'PRAGMA foreign_key_list("{table}")')),
        }
    conn.close()
    return shape


@pytest.fixture
def from_schema(tmp_path):
    path = tmp_path / "schema.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(migrations.SCHEMA_PATH.read_text())
    conn.close()
    return describe(path)


@pytest.fixture
def from_models(tmp_path):
    path = tmp_path / "models.sqlite3"
    # Keep the portable type names schema.sql declares; peewee would write INTEGER for both on SQLite.
    database = SqliteDatabase(path, field_types={"BIGINT": "BIGINT", "BOOL": "BOOLEAN", "BLOB": "BYTEA"})
    with database.bind_ctx(models.MODELS):
        database.create_tables(models.MODELS)
    database.close()
    return describe(path)


def test_models_and_schema_have_the_same_tables(from_schema, from_models):
    assert sorted(from_schema) == sorted(from_models)


@pytest.mark.parametrize("part", ["columns", "indexes", "foreign_keys"])
def test_models_and_schema_agree_table_by_table(from_schema, from_models, part):
    for table in from_schema:
        assert from_models[table][part] == from_schema[table][part], table


def test_schema_applied_twice_describes_the_same_database(tmp_path, from_schema):
    path = tmp_path / "twice.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(migrations.SCHEMA_PATH.read_text())
    conn.executescript(migrations.SCHEMA_PATH.read_text())
    conn.close()
    assert describe(path) == from_schema


@pytest.mark.parametrize("version, shown", [((3, 34, 1), "3.34.1"), ((3, 31, 1), "3.31.1"), ((2, 8, 17), "2.8.17")])
def test_a_sqlite_older_than_3_35_is_refused_in_one_line(version, shown):
    with pytest.raises(RuntimeError) as refusal:
        connection.require_version("SQLite", version, connection.SQLITE_FLOOR)
    assert str(refusal.value) == (f"SQLite {shown} found; the service needs SQLite 3.35.0 or newer "
                                  "(UPDATE … RETURNING, MATERIALIZED)")


@pytest.mark.parametrize("version", [(3, 35, 0), (3, 40, 1), (4, 0, 0)])
def test_sqlite_3_35_or_newer_is_accepted(version):
    connection.require_version("SQLite", version, connection.SQLITE_FLOOR)


@pytest.mark.parametrize("number, shown", [(110022, "11.22"), (90605, "9.6.5")])
def test_a_postgresql_older_than_12_is_refused_in_one_line(number, shown):
    with pytest.raises(RuntimeError) as refusal:
        connection.require_version("PostgreSQL", connection.postgresql_version(number), connection.POSTGRESQL_FLOOR)
    assert str(refusal.value) == (f"PostgreSQL {shown} found; the service needs PostgreSQL 12 or newer "
                                  "(UPDATE … RETURNING, MATERIALIZED)")


@pytest.mark.parametrize("number", [120000, 150004, 170002])
def test_postgresql_12_or_newer_is_accepted(number):
    connection.require_version("PostgreSQL", connection.postgresql_version(number), connection.POSTGRESQL_FLOOR)


def test_opening_a_sqlite_database_checks_the_version_before_anything_else(tmp_path):
    path = tmp_path / "instance" / "partner.sqlite3"
    with pytest.raises(RuntimeError, match="SQLite 3.34.1 found"):
        connection.require_supported(connection.bind(f"sqlite:///{path}"), sqlite_version=(3, 34, 1))
    assert not path.parent.exists()  # nothing created, nothing opened


def test_an_acknowledged_sqlite_commit_is_durable_and_the_engines_bookkeeping_is_not_fsynced(app):
    """synchronous=FULL (2) for a write that is acknowledged (the default): its commit is fsynced;
    NORMAL (1) for the delivery engine's own, and for everything once the durable one is done."""
    from partner.store.sql import write_transaction

    def synchronous() -> int:
        return models.db.execute_sql("PRAGMA synchronous").fetchone()[0]

    with app.app_context(), models.db.connection_context():
        with write_transaction():
            assert synchronous() == 2
            with write_transaction(durable=False):  # nested: the outer transaction decides
                assert synchronous() == 2
        with write_transaction(durable=False):
            assert synchronous() == 1
        assert synchronous() == 1
