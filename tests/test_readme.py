"""The README stands alone: its first session runs as written, the worked signature example is what
signing.sign computes, and the links of every doc stay inside the repository."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import signing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WEBHOOKS = ROOT / "docs" / "webhooks.md"
DOCS = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def signature_example() -> dict[str, str]:
    """The `name: value` lines of the fenced block after the signature-example marker."""
    text = WEBHOOKS.read_text(encoding="utf-8")
    block = re.search(r"<!-- signature-example:.*?-->\s*```text\n(.*?)\n```", text, re.S)
    assert block, "docs/webhooks.md lost its worked signature example"
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
    assert f"SHA2-256(stdin)= {digest}" in WEBHOOKS.read_text(encoding="utf-8")


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


# The first session: every ```sh block under "## A first session", run in order by one bash, in a
# copy of the repository, inside network and PID namespaces of its own. There, 127.0.0.1:8000 and
# :9000 are free whatever else runs on the host, loopback is the only network (no delivery can
# leave the machine), and every process the session started dies with it.
NAMESPACES = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]
SESSION_SECONDS = 120


class Step:
    """Commands the README runs together, and the stdout it shows for them: `…` stands for anything,
    and a step that shows nothing must print nothing."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.shown: list[str] = []

    def matches(self, output: str) -> bool:
        pattern = "\n".join(".*".join(map(re.escape, line.split("…"))) for line in self.shown)
        return re.fullmatch(pattern, output.rstrip("\n"), re.S) is not None


def first_session() -> list[Step]:
    """The session's steps: a blank line ends a step, `# ` lines right after commands are their output."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## A first session\n", 1)[1].split("\n## ", 1)[0]
    steps = [Step()]
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines() + [""]:
            step = steps[-1]
            if line.startswith("# "):
                step.shown.append(line[2:])
            elif not line.strip():
                steps.append(Step())
            else:
                if step.shown:
                    step = Step()
                    steps.append(step)
                step.commands.append(line)
    return [step for step in steps if step.commands]


def session_script(steps: list[Step], logs: Path) -> str:
    """One bash script: each step's output to files of its own (background jobs' later output too)."""
    lines = ["set -euo pipefail", "set -m", "ip link set lo up"]
    for number, step in enumerate(steps):
        output = f"> {logs}/{number}.out 2> {logs}/{number}.err"
        lines += [f"echo {number} > {logs}/at", "{", *step.commands, f"}} {output}"]
    return "\n".join(lines + ["wait", f"echo done > {logs}/at"]) + "\n"


@pytest.fixture
def clone(tmp_path) -> Path:
    """The tracked files as they are now, with the suite's own .venv: `make run` must not install."""
    venv = (ROOT / ".venv").resolve()
    if not (venv / ".installed").exists():
        pytest.skip("no .venv made by make: run `make test` once")
    if subprocess.run([*NAMESPACES, "ip", "link", "set", "lo", "up"], capture_output=True).returncode:
        pytest.skip("unprivileged user, network and PID namespaces (unshare -rnpf, ip) are not available")
    copy = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(venv)
    installed = (venv / ".installed").stat().st_mtime
    for requirements in copy.glob("requirements*.txt"):
        os.utime(requirements, (installed - 60, installed - 60))
    assert subprocess.run(["make", "-q", ".venv/.installed"], cwd=copy).returncode == 0
    return copy


@pytest.mark.servers  # the session's `make run` starts gunicorn
def test_the_first_session_runs_as_written(clone, tmp_path):
    steps = first_session()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "at").write_text("the namespaces")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path),
           "TMPDIR": str(tmp_path), "LANG": "C.UTF-8"}
    script = tmp_path / "session.sh"
    script.write_text(session_script(steps, logs))
    ran = subprocess.run([*NAMESPACES, "bash", str(script)], cwd=clone, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=SESSION_SECONDS)
    reached = (logs / "at").read_text().strip()
    assert ran.returncode == 0 and reached == "done", failed_step(steps, logs, reached, ran)
    for number, step in enumerate(steps):
        output = (logs / f"{number}.out").read_text()
        assert step.matches(output), failed_step(steps, logs, str(number), "output differs")


def failed_step(steps: list[Step], logs: Path, number: str, why) -> str:
    """What a failed step ran, showed, printed and complained of."""
    if not number.isdigit():
        return f"stopped at {number}: {why}"
    out, err = ((logs / f"{number}{suffix}").read_text() for suffix in (".out", ".err"))
    step = steps[int(number)]
    shown = "\n".join(step.shown)
    return f"{why}\n$ " + "\n".join(step.commands) + f"\nshown:\n{shown}\nstdout:\n{out}\nstderr:\n{err}"


def test_the_readme_is_a_front_door():
    assert len(README.read_bytes()) <= 10 * 1024


def test_the_architecture_names_every_module_and_no_other():
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/.]+\.py)`", architecture))
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True)
    modules = {name for name in tracked.stdout.split() if (ROOT / name).is_file()}
    assert sorted(modules - named) == [], "modules docs/architecture.md does not name"
    assert sorted(name for name in named if not (ROOT / name).is_file()) == [], "named, not in the repo"
