"""Hand-written SQL binds its parameters by name: a name missing or left over fails loudly."""

import re

import pytest

from tests.test_layers import MODULES, ROOT

from partner.store.sql import ParameterError, bind, run_sql


def test_names_bind_in_the_order_the_statement_uses_them():
    text, values = bind("SELECT :b, :a, :b, x::text FROM t WHERE y IN (:ids) AND (p, q) IN (VALUES :rows)",
                        {"a": 1, "b": 2, "ids": [3, 4], "rows": [(5, 6), (7, 8)]}, "?")
    assert text == "SELECT ?, ?, ?, x::text FROM t WHERE y IN (?, ?) AND (p, q) IN (VALUES (?, ?), (?, ?))"
    assert values == (2, 1, 2, 3, 4, 5, 6, 7, 8)


@pytest.mark.parametrize("params", [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": []}])
def test_a_missing_unused_or_empty_parameter_is_an_error(params):
    with pytest.raises(ParameterError):
        bind("SELECT :a, :b", params, "?")


def test_the_database_never_sees_a_statement_missing_a_parameter(database):
    with pytest.raises(ParameterError):
        run_sql("SELECT :a AS a", {})
    assert run_sql("SELECT :a AS a", {"a": 7}).fetchone()[0] == 7


# A positional placeholder (the drivers' `?` and `%s`, ours before names), on a line of SQL.
POSITIONAL = re.compile(r"\{p\}|\{ids\}|%s|(?<![\w'\"])\?(?=\s*[,)'\"]|\s+(AND|OR|LIMIT)\b)|\.param\b")
SQL_LINE = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|WHERE|VALUES|SET|LIMIT|AND)\b|\.param\b")


def product_sources():
    return sorted(set(MODULES.values()))


def test_no_product_statement_binds_by_position():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in product_sources() if path.name != "sql.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if SQL_LINE.search(line) and POSITIONAL.search(line)]
    assert found == []
