"""The errors the domain raises: one type that knows its HTTP response, and the operator's refusal."""


class ApiError(Exception):
    """An error with its HTTP status, contract `code` and a partner-facing detail."""

    def __init__(self, status: int, code: str, detail: str,
                 errors: list[dict] | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}


class ValidationError(ApiError):
    """A 422 carrying one entry per rejected field."""

    def __init__(self, errors: list[dict]):
        super().__init__(422, "validation_error", "The request has invalid fields.", errors=errors)


def field_error(field: str, code: str, message: str) -> dict:
    return {"field": field, "code": code, "message": message}


class OperatorError(Exception):
    """A refusal the operator must read: the command exits 1 with this message."""
