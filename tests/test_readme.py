"""The README stands alone: its worked signature example is what signing.sign computes, and its
links (and those of docs/) stay inside the repository."""

import re
from pathlib import Path

import pytest

import signing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def signature_example() -> dict[str, str]:
    """The `name: value` lines of the fenced block after the signature-example marker."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- signature-example:.*?-->\s*```text\n(.*?)\n```", text, re.S)
    assert block, "README.md lost its worked signature example"
    return dict(line.split(": ", 1) for line in block.group(1).splitlines())


def test_worked_example_signature_is_what_sign_computes():
    example = signature_example()
    body = example["body"].strip().encode("utf-8")
    timestamp = example["X-VC-Timestamp"].strip()
    expected = signing.sign(example["secret"].strip(), int(timestamp), body)
    assert example["X-VC-Signature"].strip() == expected


def test_worked_example_verifies_at_its_own_time():
    example = {name: value.strip() for name, value in signature_example().items()}
    headers = {"X-VC-Signature": example["X-VC-Signature"], "X-VC-Timestamp": example["X-VC-Timestamp"]}
    signing.verify(headers, example["body"].encode(), example["secret"],
                   now_ms=int(example["X-VC-Timestamp"]))


def test_shell_recipe_prints_the_same_digest():
    digest = signature_example()["X-VC-Signature"].strip().removeprefix("sha256=")
    assert f"SHA2-256(stdin)= {digest}" in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_docs_link_only_inside_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    for name in ("SPEC.md", "CONTRACT.md", "../shared"):
        assert name not in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):  # an absolute URL: only the service's own pages
            assert target.startswith("http://127.0.0.1"), target
            continue
        resolved = (doc.parent / target).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), target
