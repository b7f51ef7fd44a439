"""The errors the domain raises: one type that knows its HTTP response, the operator's refusal, the
service's refusal to start, and a resource of ours too busy to attempt a delivery."""


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


# A 422 lists at most this many field errors: a 64 KiB body of unknown fields once got a 734 KB answer.
MAX_FIELD_ERRORS = 20


class ValidationError(ApiError):
    """A 422 carrying one entry per rejected field, the first MAX_FIELD_ERRORS of them."""

    def __init__(self, errors: list[dict]):
        detail = "The request has invalid fields."
        unlisted = len(errors) - MAX_FIELD_ERRORS
        if unlisted > 0:
            detail += f" The first {MAX_FIELD_ERRORS} are listed; {unlisted} more are not."
        super().__init__(422, "validation_error", detail, errors=errors[:MAX_FIELD_ERRORS])


def field_error(field: str, code: str, message: str) -> dict:
    return {"field": field, "code": code, "message": message}


class OperatorError(Exception):
    """A refusal the operator must read: the command exits 1 with this message."""


# gunicorn's exit status for an app that cannot load: its master stops instead of booting workers again.
APP_LOAD_ERROR = 4


class StartRefused(Exception):
    """The service cannot start with this configuration or database; create_app has said why in one
    line of the log."""


class OurResourcesBusy(Exception):
    """Something this process has only so much of (lookup threads, descriptors) is taken: the attempt
    that needed it was not made, so it is put off `retry_seconds`, never counted against the partner
    (partner/courier.py). `what` names the resource in the log line."""

    what = "a resource of this process busy"
    retry_seconds: float = 1
