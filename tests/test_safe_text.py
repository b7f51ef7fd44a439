"""safe_text: NUL and C0 controls replaced, excerpts bounded in bytes on a character boundary."""

import pytest

from partner.safe_text import EXCERPT_BYTES, clean, excerpt, has_controls


@pytest.mark.parametrize("text, cleaned", [
    ("plain", "plain"), ("a\x00b", "a\ufffdb"), ("tab\tnew\nline", "tab\tnew\nline"),
    ("cr\r\x1b[0m\x7f", "cr\ufffd\ufffd[0m\x7f"), ("é😀", "é😀"),
])
def test_clean_replaces_c0_controls_but_tab_and_newline(text, cleaned):
    assert clean(text) == cleaned
    assert has_controls(text) is (text != cleaned)


@pytest.mark.parametrize("body", [b"\xff" * 5000, b"\x00" * 5000, "é".encode() * 3000,
                                  "😀".encode() * 1000, b"a" * 1023 + "é".encode(), b""])
def test_an_excerpt_is_at_most_1024_bytes_once_encoded_and_valid_text(body):
    text = excerpt(body)
    assert len(text.encode()) <= EXCERPT_BYTES
    assert not has_controls(text)
    assert text == clean(body[:EXCERPT_BYTES].decode("utf-8", "replace"))[:len(text)]


def test_an_excerpt_is_cut_on_a_character_boundary():
    assert excerpt(b"a" * 1023 + "é".encode()) == "a" * 1023
    assert excerpt(b"\xff" * 5000) == "\ufffd" * 341  # 1,023 bytes: a 342nd would not fit
