"""deploy/partner-flask, the one documented way to run an operator command as the service: the unit's
user, directory, virtualenv and environment, with the environment file read as systemd reads it and
never put on a command line; and no documented command that expands that file into argv."""

import getpass
import json
import re
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

from tests.gunicorn_server import BIN, ROOT
from tests.support import ENCRYPTION_KEYS, open_database

WRAPPER = ROOT / "deploy" / "partner-flask"


def load_wrapper():
    """The wrapper as a module (its file has no .py suffix), for its parser."""
    spec = spec_from_loader("partner_flask", SourceFileLoader("partner_flask", str(WRAPPER)))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wrapper = load_wrapper()

# Each as systemd's EnvironmentFile= reads it (src/basic/env-file.c).
ENVIRONMENT_FILES = [
    ("A=1\n", {"A": "1"}),
    ('KEYS=["k1", "k 2"]\n', {"KEYS": '["k1", "k 2"]'}),  # unquoted: inner quotes and spaces kept
    ('X="a b"\n', {"X": "a b"}),
    ("X='a \"b\" $c'\n", {"X": 'a "b" $c'}),
    (r'X="q\" b\\ d\$ n\n"' "\n", {"X": r'q" b\ d$ n\n'}),  # only " \ ` $ are unescaped
    ('X="{\\"a\\": [1, 2]}"\n', {"X": '{"a": [1, 2]}'}),
    ("X=a b \t\n", {"X": "a b"}),  # trailing whitespace dropped, inner kept
    ("  # a comment\n; another\nX=1\n", {"X": "1"}),
    ("X=a\\\nb\n", {"X": "ab"}),  # a continued line
    ("X = 1\n", {"X": "1"}),
    ("X=\n", {"X": ""}),
    ("X=1\nX=2\n", {"X": "2"}),
    ("1X=1\nA-B=2\nnot an assignment\n", {}),
    ("X=1", {"X": "1"}),
    ('X="line one\nline two"\n', {"X": "line one\nline two"}),
]


@pytest.mark.parametrize("text, expected", ENVIRONMENT_FILES)
def test_the_environment_file_is_read_as_systemd_reads_it(text, expected):
    assert wrapper.parse_environment_file(text) == expected


def unit(tmp_path: Path, exec_start: str, working_directory: Path, environment_file: Path) -> Path:
    path = tmp_path / "partner.service"
    path.write_text(f"""[Unit]
Description=the test's service
Environment=NOT_OF_THE_SERVICE=1

[Service]
User={getpass.getuser()}
WorkingDirectory={working_directory}
Environment=PARTNER_TRUSTED_PROXIES=1
Environment="SPACED=one two" PARTNER_DATABASE_URL=sqlite:////var/lib/partner/partner.sqlite3
EnvironmentFile=-{environment_file}
EnvironmentFile=-{tmp_path}/absent
ExecStart={exec_start} wsgi:app
""")
    return path


SECRETS = {
    "PARTNER_ENCRYPTION_KEYS": '["c3VpdGUta2V5LW5vdC1zZWNyZXQtMzItYnl0ZXMhISE", "a key with spaces"]',
    "GUNICORN_CMD_ARGS": "--workers 2 --timeout 30",
    "QUOTED": 'it "is" $HOME, \\ and `this`',
}
ENVIRONMENT_FILE = (
    "# the secrets, mode 0600\n"
    f"PARTNER_ENCRYPTION_KEYS={SECRETS['PARTNER_ENCRYPTION_KEYS']}\n"
    f'GUNICORN_CMD_ARGS="{SECRETS["GUNICORN_CMD_ARGS"]}"\n'
    "QUOTED='it \"is\" $HOME, \\ and `this`'\n"
    "PARTNER_TRUSTED_PROXIES=2\n")


def run_wrapper(unit_path: Path, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WRAPPER), "--unit", str(unit_path), *args], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LEAKED": "from the caller", **env})


def test_a_command_gets_the_services_environment_and_no_value_reaches_a_command_line(tmp_path):
    """A stand-in flask reports what it got: its environment, and its own /proc/<pid>/cmdline (the
    wrapper execs it in the same process, so that is every command line the command ever had)."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir(), work.mkdir()
    flask = bin_dir / "flask"
    flask.write_text(f"#!{sys.executable}\nimport json, os\nprint(json.dumps({{'environment': dict(os.environ), "
                     "'cmdline': open('/proc/self/cmdline', 'rb').read().decode(), 'cwd': os.getcwd()}))\n")
    flask.chmod(0o755)
    (tmp_path / "environment").write_text(ENVIRONMENT_FILE)
    result = run_wrapper(unit(tmp_path, str(bin_dir / "gunicorn"), work, tmp_path / "environment"),
                         "keys", "create", "--org", "acme")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    # The kernel runs the script by its interpreter: [python3, flask, arguments…].
    assert seen["cmdline"].split("\0")[1:-1] == [str(flask), "keys", "create", "--org", "acme"]
    assert not any(value in seen["cmdline"] for value in SECRETS.values())
    environment = seen["environment"]
    assert {name: environment[name] for name in SECRETS} == SECRETS
    assert (environment["SPACED"], environment["PARTNER_DATABASE_URL"]) == \
        ("one two", "sqlite:////var/lib/partner/partner.sqlite3")
    assert environment["PARTNER_TRUSTED_PROXIES"] == "2"  # the file wins over Environment=, as in systemd
    assert "LEAKED" not in environment and "NOT_OF_THE_SERVICE" not in environment
    assert (environment["USER"], seen["cwd"]) == (getpass.getuser(), str(work))


@pytest.mark.servers  # a flask command in a process of its own
def test_the_real_operator_cli_runs_through_it_with_json_keys_unquoted(tmp_path):
    """As docs/deploying.md writes the file: the keys as a JSON list, no quotes around it."""
    (tmp_path / "environment").write_text(
        f"PARTNER_DATABASE_URL=sqlite:///{tmp_path}/partner.sqlite3\n"
        f"PARTNER_ENCRYPTION_KEYS={json.dumps(ENCRYPTION_KEYS)}\n")
    service = unit(tmp_path, str(BIN / "gunicorn"), ROOT, tmp_path / "environment")
    open_database(f"sqlite:///{tmp_path}/partner.sqlite3").close_all()  # as the service's first start makes it
    result = run_wrapper(service, "keys", "create", "--org", "acme", "--scope", "webhooks:manage")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("vck_")
    listed = run_wrapper(service, "keys", "list")
    assert listed.returncode == 0 and "\tacme\t" in listed.stdout, listed.stderr


def test_a_missing_unit_or_environment_file_is_one_line(tmp_path):
    result = run_wrapper(tmp_path / "nowhere.service", "keys", "list")
    assert (result.returncode, result.stderr) == (
        1, f"partner-flask: no unit at {tmp_path}/nowhere.service: install it first (docs/deploying.md), or name it "
           "with --unit\n")
    service = unit(tmp_path, str(BIN / "gunicorn"), ROOT, tmp_path / "environment")
    service.write_text(service.read_text().replace("EnvironmentFile=-", "EnvironmentFile="))
    result = run_wrapper(service, "keys", "list")
    assert (result.returncode, result.stderr) == (
        1, f"partner-flask: the environment file {tmp_path}/environment is missing\n")


# A command that puts the environment file's contents on a command line: `env $(cat …)`, `$(grep …)`,
# `xargs`, or a shell sourcing it (which also reads JSON values as shell words).
EXPANDS_THE_FILE = re.compile(r"\$\(\s*(?:cat|grep|sed|awk|<|tr|cut)\b|`\s*(?:cat|grep)\b|\benv\s+\$\(|xargs"
                              r"|\bexport\s+\$\(|\bset\s+-a\b|(?:^|[;&|]\s*)(?:\.|source)\s+\S*environment")


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every fenced code line and every inline code span of the docs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
            found += [(path.name, line) for line in block.splitlines() if line.strip()]
        outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        found += [(path.name, span) for span in re.findall(r"`([^`\n]+)`", outside.replace("\n", " "))]
    return found


def test_no_documented_command_expands_the_environment_file_into_argv():
    commands = documented_commands()
    assert len(commands) > 100  # the docs were read
    assert [(doc, command) for doc, command in commands if EXPANDS_THE_FILE.search(command)] == []


def test_the_docs_run_operator_commands_through_the_wrapper():
    assert any("/opt/partner/deploy/partner-flask keys create" in command for _, command in documented_commands())
