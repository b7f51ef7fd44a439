"""safe_text: NUL and C0 controls replaced, excerpts bounded in bytes on a character boundary."""

import pytest

from partner.safe_text import EXCERPT_BYTES, character_name, clean, excerpt, has_controls, unfit_for_a_label


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


@pytest.mark.parametrize("text, unfit", [
    ("plain", None), ("tab\tnew\nline", None), ("\u05e9\u05dc\u05d5\u05dd", None), ("\u00a0\u00ad\u200b", None),
    ("a\x00b", "\x00"), ("a\x7fb", "\x7f"), ("a\x85b", "\x85"), ("a\x9b2J", "\x9b"), ("\u2069\u202a", "\u2069"),
    *[(f"a{chr(code)}", chr(code)) for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))],
])
def test_a_label_holds_no_control_but_tab_and_newline_and_no_bidi_control(text, unfit):
    assert unfit_for_a_label(text) == unfit


def test_a_character_is_named_by_its_code_point_and_its_unicode_name():
    assert [character_name(ch) for ch in "\u202e\x85"] == ["U+202E RIGHT-TO-LEFT OVERRIDE", "U+0085"]
