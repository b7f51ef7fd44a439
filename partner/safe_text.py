"""Text from outside (response bodies, partner input) made safe to store on every backend.

PostgreSQL refuses NUL in text; other C0 controls are harmless to store but break logs and terminals
of whoever reads them. A label a partner writes and pages show (a description) must also be shown
as it is stored: no C1 control (U+009B starts a terminal escape, U+0085 breaks a line) and no bidi
control, which makes a page show its text in another order (Trojan Source). One rule for all of it, here.
"""

import re
import unicodedata

EXCERPT_BYTES = 1024
REPLACEMENT = "\ufffd"
# C0 controls other than tab and newline.
_CONTROLS = {code: REPLACEMENT for code in range(0x20) if chr(code) not in "\t\n"}
# Unicode's Bidi_Control characters: the contract's marks, embeddings, overrides and isolates, and
# the Arabic letter mark, which acts as one.
BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_NOT_IN_A_LABEL = frozenset(_CONTROLS) | frozenset(range(0x7F, 0xA0)) | BIDI_CONTROLS  # DEL and C1 too


def clean(text: str) -> str:
    """`text` with NUL and every C0 control other than tab and newline replaced by U+FFFD."""
    return text.translate(_CONTROLS)


def has_controls(text: str) -> bool:
    """Whether `clean` would change `text`."""
    return any(ord(ch) in _CONTROLS for ch in text)


def unfit_for_a_label(text: str) -> str | None:
    """The first character of `text` a label must not hold (a control but tab and newline, a bidi
    control), or None."""
    return next((ch for ch in text if ord(ch) in _NOT_IN_A_LABEL), None)


def character_name(ch: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`; a control character has a code point only (`U+0085`)."""
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X} {name}" if name else f"U+{ord(ch):04X}"


def excerpt(body: bytes, limit: int = EXCERPT_BYTES) -> str:
    """The start of a response body as clean text of at most `limit` bytes once encoded as UTF-8,
    cut on a character boundary (invalid bytes become U+FFFD, three bytes each, so decoding
    `limit` bytes alone is not enough)."""
    text = clean(bytes(body[:limit]).decode("utf-8", errors="replace"))
    return text.encode()[:limit].decode("utf-8", errors="ignore")


# C0, DEL, C1, the characters that text tools take for a line break, and the bidi controls that make
# a terminal show a line's text in another order; shown as Python escapes. Logs and the operator's
# CLI print text from outside (a receiver's status line, body, Location) through this one function.
_PRINTED_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *BIDI_CONTROLS]
_ESCAPES = str.maketrans({code: chr(code).encode("unicode_escape").decode() for code in _PRINTED_CONTROLS})
_ANY_CONTROL = re.compile("[" + "".join(re.escape(chr(code)) for code in _PRINTED_CONTROLS) + "]")


def printable(text: str) -> str:
    r"""`text` on one line, every control character escaped: `\r`, `\n`, `\x1b`, `\x9b`, `\u202e`."""
    # Most text holds none, and a search costs a quarter of a translate (0.5 against 2 µs a line).
    return text.translate(_ESCAPES) if _ANY_CONTROL.search(text) else text
