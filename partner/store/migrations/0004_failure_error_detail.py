"""Release 1.3: each failure record keeps its cause in words (`failure.error_detail`: the refusal,
the reset, the certificate error, a redirect's Location, the phase that timed out). Failures recorded
before it have none (null). A nullable column is added in place on SQLite and PostgreSQL alike."""

STATEMENTS = ('ALTER TABLE "failure" ADD COLUMN "error_detail" TEXT',)


def up(migrator, db):
    for statement in STATEMENTS:
        db.execute_sql(statement)
