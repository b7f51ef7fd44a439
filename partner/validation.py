"""Validation as data, of a request body or an operator's input: declare the fields, reject unknown
ones, report every error at once."""

from dataclasses import dataclass
from typing import Any, Callable

from partner.errors import ValidationError, field_error

# A check returns None when the value is fine, or (code, message).
Check = Callable[[Any], tuple[str, str] | None]


@dataclass(frozen=True)
class Field:
    name: str
    required: bool = False
    max_length: int | None = None
    check: Check | None = None
    kind: type = str  # the JSON type: str, or list (whose check looks at its entries)


def validate(body: dict, fields: tuple[Field, ...]) -> dict:
    """Return the declared fields of `body` (absent optional ones as None), or raise one 422."""
    errors = []
    for field in fields:
        error = _field_error(field, body.get(field.name), field.name in body)
        if error:
            errors.append(field_error(field.name, *error))
    # After the declared fields' errors, so that a list cut short never hides one of those.
    known = {field.name for field in fields}
    errors += [field_error(name, "unknown_field", "This field is not accepted.")
               for name in body if name not in known]
    if errors:
        raise ValidationError(errors)
    return {field.name: body.get(field.name) for field in fields}


_KINDS = {str: "a string", list: "a list"}


def _field_error(field: Field, value: Any, present: bool) -> tuple[str, str] | None:
    if not present or value is None:  # null means "not given", for every field
        return ("required", "This field is required.") if field.required else None
    if type(value) is not field.kind:  # exact: a number is not a string
        return "invalid_type", f"This field must be {_KINDS[field.kind]}."
    if field.max_length is not None and len(value) > field.max_length:
        return "too_long", f"This field is at most {field.max_length} characters."
    return field.check(value) if field.check else None
