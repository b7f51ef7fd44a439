"""JSON Schema (draft 2020-12) validators whose regular expressions are bounded in time.

`pattern`, `patternProperties` and `additionalProperties` (which reads `patternProperties`) match
strings a publisher chooses against patterns an operator wrote. Python's `re` backtracks without
bound: `(x+x+)+y` against 40 x's takes hours, and one publish would hold a worker's CPU. These three
keywords match with the `regex` module instead, each match bounded by PATTERN_SECONDS; a match that
runs out is a schema mismatch ("took too long"), never a hang. Everything else is jsonschema's own.
"""

import regex
from jsonschema import Draft202012Validator, ValidationError, validators

PATTERN_SECONDS = 0.05


class PatternTooSlow(Exception):
    """A pattern of the schema took longer than PATTERN_SECONDS on the data."""


def _search(pattern: str, text: str) -> bool:
    try:
        return regex.search(pattern, text, timeout=PATTERN_SECONDS) is not None
    except TimeoutError:
        raise PatternTooSlow(f"the schema's pattern {pattern[:60]!r} took too long to check") from None


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for name, value in instance.items():
                if _search(pattern, name):
                    yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = [name for name in instance if name not in named and not any(_search(p, name) for p in patterns)]
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif not additional and extras:
        yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, sorted(extras)))} "
                              f"{'was' if len(extras) == 1 else 'were'} unexpected)")


BoundedValidator = validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties})
