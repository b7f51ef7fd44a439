"""Text from outside (response bodies, partner input) made safe to store on every backend.

PostgreSQL refuses NUL in text; other C0 controls are harmless to store but break logs and terminals
of whoever reads them. One rule for all of it, here.
"""

EXCERPT_BYTES = 1024
REPLACEMENT = "\ufffd"
# C0 controls other than tab and newline.
_CONTROLS = {code: REPLACEMENT for code in range(0x20) if chr(code) not in "\t\n"}


def clean(text: str) -> str:
    """`text` with NUL and every C0 control other than tab and newline replaced by U+FFFD."""
    return text.translate(_CONTROLS)


def has_controls(text: str) -> bool:
    """Whether `clean` would change `text`."""
    return any(ord(ch) in _CONTROLS for ch in text)


def excerpt(body: bytes, limit: int = EXCERPT_BYTES) -> str:
    """The start of a response body as clean text of at most `limit` bytes once encoded as UTF-8,
    cut on a character boundary (invalid bytes become U+FFFD, three bytes each, so decoding
    `limit` bytes alone is not enough)."""
    text = clean(bytes(body[:limit]).decode("utf-8", errors="replace"))
    return text.encode()[:limit].decode("utf-8", errors="ignore")
