"""The README and the docs site say what the code does: every shell example runs here or says why not,
the README's commands work as written, the architecture and the manual pages are made from (or held
to) the code."""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.net import free_port, wait_listening
from support.s3 import seaweedfs
from support.streams import FIXTURES, ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
SHELL = {"sh", "console"}
MARKER = re.compile(r"<!-- example: (runs \((?P<name>[a-z-]+)\)|not run \((?P<why>.+)\)) -->")


@dataclass
class Example:
    file: Path
    line: int
    lang: str
    text: str
    name: str | None  # runs: the name the test that runs it gives; None: marked as not run


def documents() -> list[Path]:
    return [p for p in (README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))) if p.exists()]


def examples(path: Path) -> list[Example]:
    """The shell examples of ``path`` (fences ```sh and ```console), each with the marker above it."""
    lines = path.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[i])
        if fence:
            end = lines.index("```", i + 1)
            if fence.group(1) in SHELL:
                marker = MARKER.fullmatch(lines[i - 1]) if i else None
                if marker is None:
                    raise AssertionError(f"{path.relative_to(ROOT)}:{i + 1}: a shell example without a marker")
                found.append(Example(path, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]), marker["name"]))
            i = end
        i += 1
    return found


def example(path: Path, name: str) -> str:
    (found,) = [e.text for e in examples(path) if e.name == name]
    return found


# Every example marked "runs (NAME)" and the test that runs it.
RUN = {
    ("README.md", "first-command"): "test_the_first_command_installs_into_a_venv_of_the_system_python",
    ("README.md", "five-commands"): "test_one_host_to_another_in_five_commands",
    ("README.md", "fleet"): "test_a_fleet_as_the_readme_says",
    ("README.md", "object-storage"): "test_object_storage_as_the_readme_says",
    ("docs/reference/manual.md", "man-install"): "test_the_manual_pages_install_as_documented",
    ("docs/guides/inspect.md", "diff"): "test_console_examples_print_what_they_show",
    ("docs/guides/library.md", "example-script"): "test_console_examples_print_what_they_show",
    ("docs/guides/backups.md", "backup-host"): "test_a_host_s_backups_as_the_guide_says",
}


def test_every_shell_example_runs_or_is_marked_as_not_run() -> None:
    marked = {}
    for path in documents():
        for found in examples(path):
            if found.name:
                marked[(str(path.relative_to(ROOT)), found.name)] = found
    assert set(marked) == set(RUN), "an example marked as run that no test runs, or a test of a gone example"
    for test in RUN.values():
        assert callable(globals().get(test)), test


def test_the_readme_is_a_few_screens() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated figures go to the docs, not the README"


def test_the_readme_s_test_command_is_the_one_ci_runs() -> None:
    (command,) = [e.text for e in examples(README) if e.text.startswith("tools/setup-tests")]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci, f"{command!r} is not a line of .ci/run"
    assert ci.index(command) < ci.index("mkdocs build --strict --quiet")


def test_the_links_of_the_readme_and_contributing_lead_to_files() -> None:
    for path in (README, ROOT / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{path.name} links to {target}, which is not there"


# --- shell examples, run as written (hosts, ports and directories replaced by the test's own) ---


@contextmanager
def shell(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose `sendstream` and `python3` are this checkout's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, argv in {"sendstream": f'"{sys.executable}" -m sendstream', "python3": f'"{sys.executable}"'}.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    yield env


def commands(text: str, replace: dict[str, str]) -> list[str]:
    """The command lines of an example, with ``replace`` applied; comments and blank lines dropped."""
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            for old, new in replace.items():
                line = line.replace(old, new)
            found.append(line)
    return found


class Host:
    """Runs an example's lines in order, the listening ones (receive, serve) in the background."""

    def __init__(self, cwd: Path, env: dict[str, str], port: int) -> None:
        self.cwd, self.env, self.port = cwd, env, port
        self.background: list[subprocess.Popen[str]] = []
        self.outputs: list[str] = []

    def run(self, line: str) -> None:
        listener = re.match(r"sendstream (receive --listen|serve --config)", line) and "--check-config" not in line
        if listener:
            proc = subprocess.Popen(
                ["bash", "-c", line], cwd=self.cwd, env=self.env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            self.background.append(proc)
            wait_listening(self.port)
            return
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, f"{line}\nexit {result.returncode}\n{result.stderr[-3000:]}"
        self.outputs.append(result.stdout)

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def host(cwd: Path, env: dict[str, str], port: int) -> Iterator[Host]:
    running = Host(cwd, env, port)
    try:
        yield running
    finally:
        running.stop()


def data_subvolume(mnt: Path) -> Path:
    """A subvolume with a few files, as a sending host's /srv/data."""
    subprocess.run(["btrfs", "subvolume", "create", str(mnt / "data")], check=True, capture_output=True)
    (mnt / "data" / "etc").mkdir()
    (mnt / "data" / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    (mnt / "data" / "big.bin").write_bytes(os.urandom(300_000))
    os.symlink("etc/hosts", mnt / "data" / "link")
    return mnt / "data"


def same_tree(a: Path, b: Path) -> None:
    names_a = sorted(str(p.relative_to(a)) for p in a.rglob("*"))
    assert names_a == sorted(str(p.relative_to(b)) for p in b.rglob("*"))
    for name in names_a:
        pa, pb = a / name, b / name
        if pa.is_symlink():
            assert os.readlink(pa) == os.readlink(pb)
        elif pa.is_file():
            assert pa.read_bytes() == pb.read_bytes(), name


@pytest.mark.btrfs
def test_one_host_to_another_in_five_commands(tmp_path: Path) -> None:
    """The README's five commands, on two loop-device btrfs (the sending host's /srv, the backup host's
    /backup): TLS into `btrfs receive`, the snapshot received read-only with its received UUID."""
    need_root_btrfs()
    port = free_port()
    with ExitStack() as stack:
        srv = stack.enter_context(btrfs_loop("512M"))
        backup = stack.enter_context(btrfs_loop("512M"))
        env = stack.enter_context(shell(tmp_path))
        source = data_subvolume(srv)
        lines = commands(
            example(README, "five-commands"),
            {"backup.example": "127.0.0.1", ":7000": f":{port}", "/srv": str(srv), "/backup": str(backup)},
        )
        assert len(lines) == 5
        with host(tmp_path, env, port) as run:
            for line in lines:
                run.run(line)
            (receiver,) = run.background
            assert receiver.wait(60) == 0, receiver.stderr.read() if receiver.stderr else ""
        shown = run.outputs[-1]
        assert re.search(r"Received UUID:\s+[0-9a-f-]{36}", shown), shown
        assert "readonly" in shown, shown
        same_tree(source, backup / "data.1")


@pytest.mark.btrfs
def test_a_fleet_as_the_readme_says(tmp_path: Path) -> None:
    """The README's fleet: a key and serve.toml, checked; the service; a host's snapshot sent under its
    identity and stored; the service lists it for that client."""
    need_root_btrfs()
    port = free_port()
    etc, backup = tmp_path / "etc", tmp_path / "backup"
    with ExitStack() as stack:
        srv = stack.enter_context(btrfs_loop("512M"))
        env = stack.enter_context(shell(tmp_path))
        data_subvolume(srv)
        lines = commands(
            example(README, "fleet"),
            {"/etc/sendstream": str(etc), "/backup/": f"{backup}/", "/srv": str(srv), "backup.example": "127.0.0.1",
             ":7000": f":{port}"},
        )  # fmt: skip
        with host(tmp_path, env, port) as run:
            for line in lines:
                if "backup.toml" in line and not (etc / "web1.key").exists():
                    shutil.copy2(etc / "keys" / "web1.key", etc / "web1.key")  # "with the key copied to ..."
                run.run(line)
            assert "ok: 1 client (web1)" in run.outputs[2], run.outputs[2]
            took, status = run.outputs[-2:]
            (snapshot,) = re.findall(r"^data: took (data\.\d{8}T\d{4})$", took, re.M)
            assert f"data -> nas: sent {snapshot} whole (" in took, took
            assert status.startswith(f"data -> nas (service): last {snapshot} ("), status
            stored = sorted(p.name for p in backup.joinpath("web1").iterdir())
            assert len(stored) == 2 and stored[0].endswith(".stream") and stored[1].endswith(".stream.json"), stored
            assert json.loads((backup / "web1" / stored[1]).read_text())["snapshot"] == snapshot
        (service,) = run.background
        assert service.returncode == 0, service.stderr.read() if service.stderr else ""


def toml_file(path: Path, name: str) -> str:
    """The TOML block of ``path`` under ``<!-- file: NAME -->``."""
    text = path.read_text()
    found = re.search(rf"<!-- file: {re.escape(name)} -->\n```toml\n(.*?)\n```", text, re.S)
    assert found, f"{path.name} has no <!-- file: {name} --> block"
    return found.group(1)


@pytest.mark.btrfs
def test_a_host_s_backups_as_the_guide_says(tmp_path: Path) -> None:
    """The backups guide's backup.toml and commands against a service: a dry run changes nothing, a
    run sends the snapshot whole, the next an incremental of it; the status names the newest there."""
    need_root_btrfs()
    port = free_port()
    etc, place = tmp_path / "etc", tmp_path / "place"
    etc.mkdir()
    place.mkdir()
    guide = DOCS / "guides" / "backups.md"
    replace = {"/srv": "SRV", "backup.example:7000": f"127.0.0.1:{port}", "/etc/sendstream": str(etc),
               "/run/": f"{tmp_path}/"}  # fmt: skip
    with ExitStack() as stack:
        srv = stack.enter_context(btrfs_loop("512M"))
        env = stack.enter_context(shell(tmp_path))
        data_subvolume(srv)
        (srv / "snapshots").mkdir()
        config = toml_file(guide, "backup.toml")
        for old, new in replace.items():
            config = config.replace(old, new)
        (etc / "backup.toml").write_text(config.replace("SRV", str(srv)))
        lines = [f"{line} --config {etc}/backup.toml" for line in commands(example(guide, "backup-host"), {})]
        with host(ROOT, env, port) as run:
            run.run(f"sendstream key new {etc}/web1.key")
            (etc / "serve.toml").write_text(
                f'listen = "127.0.0.1:{port}"\n[clients.web1]\nkey = "web1.key"\nstore = "{place}"\n'
            )
            run.run(f"sendstream serve --config {etc}/serve.toml")
            for line in lines:
                run.run(line)
        dry, first, second, status = run.outputs[-4:]
        assert re.fullmatch(r"data: would take (data\.\d{8}T\d{4})\ndata -> nas: would send \1 whole \(.*\)\n", dry), (
            dry
        )
        snapshots = sorted(p.name for p in (srv / "snapshots").iterdir())
        assert len(snapshots) == 2 and snapshots[1] == snapshots[0] + "_1", snapshots
        assert f"data -> nas: sent {snapshots[0]} whole" in first, first
        assert f"data -> nas: sent {snapshots[1]} from {snapshots[0]}" in second, second
        assert status.startswith(f"data -> nas (service): last {snapshots[1]} ("), status
        assert "chain 1; next: the new snapshot only" in status, status
        assert len(list(place.glob("*.stream"))) == 2


def test_the_backup_units_verify(tmp_path: Path) -> None:
    """contrib/sendstream-backup.service and .timer, with sendstream where the service runs it (in a mount
    namespace whose /usr/local/bin is an overlay): systemd-analyze verify takes both."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("systemd-analyze", "unshare", "mount")):
        pytest.skip("needs root, systemd-analyze and unshare (CI has them)")
    units = [ROOT / "contrib" / f"sendstream-backup.{kind}" for kind in ("service", "timer")]
    d = "/usr/local/bin"
    script = [
        "set -e",
        f"mkdir -p {tmp_path}/upper {tmp_path}/work",
        f"mount -t overlay overlay -o lowerdir={d},upperdir={tmp_path}/upper,workdir={tmp_path}/work {d}",
        f"printf '#!/bin/sh\\nexec {sys.executable} -m sendstream \"$@\"\\n' > {d}/sendstream",
        f"chmod 0755 {d}/sendstream",
        "systemd-analyze verify " + " ".join(str(u) for u in units),
    ]
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "sendstream-backup" not in result.stderr, result.stderr


def test_object_storage_as_the_readme_says(tmp_path: Path) -> None:
    """The README's object storage example against a SeaweedFS of the tests' own (the README's `weed
    server` line on free ports): archive the sample chain, list, verify, restore, prune."""
    (tmp_path / "weed").mkdir()
    with ExitStack() as stack:
        store = stack.enter_context(seaweedfs(tmp_path / "weed"))
        env = stack.enter_context(shell(tmp_path))
        env.update({k: v for k, v in store.env.items() if k.startswith("AWS_")})
        (tmp_path / "fixtures").symlink_to(FIXTURES)
        with host(tmp_path, env, 0) as run:
            for line in commands(example(README, "object-storage"), {}):
                run.run(line)
        listing = run.outputs[3]
        assert "rich_base" in listing and "rich_incr" in listing, listing
        verdicts = run.outputs[4].splitlines()
        assert len(verdicts) == 2 and all(line.endswith(".stream: ok") for line in verdicts), verdicts
        assert "would delete" not in run.outputs[6], run.outputs[6]  # the kept stream's parent is kept
        full, incr = (FIXTURES / f"rich-{kind}-v2.stream" for kind in ("full", "incr"))
        assert (tmp_path / "chain.stream").read_bytes() == full.read_bytes() + incr.read_bytes()


def test_console_examples_print_what_they_show(tmp_path: Path) -> None:
    """A ```console example: each `$ ` line runs, and prints the lines below it."""
    with shell(tmp_path) as env:
        for path, name in (
            (DOCS / "guides" / "inspect.md", "diff"),
            (DOCS / "guides" / "library.md", "example-script"),
        ):
            text = example(path, name)
            command, *shown = text.splitlines()
            assert command.startswith("$ ")
            result = subprocess.run(["bash", "-c", command[2:]], cwd=ROOT, env=env, capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
            assert result.stdout.splitlines() == shown, result.stdout


def test_the_manual_pages_install_as_documented(tmp_path: Path) -> None:
    man = tmp_path / "man"
    with shell(tmp_path) as env:
        for line in commands(
            example(DOCS / "reference" / "manual.md", "man-install"), {"/usr/local/share/man": str(man)}
        ):
            subprocess.run(["bash", "-c", line], env=env, check=True)
    assert (man / "man1" / "sendstream.1").read_text().startswith(".TH SENDSTREAM 1")
    assert (man / "man5" / "sendstream-serve.toml.5").read_text().startswith(".TH SENDSTREAM-SERVE.TOML 5")
    assert (man / "man5" / "sendstream-backup.toml.5").read_text().startswith(".TH SENDSTREAM-BACKUP.TOML 5")


def test_the_first_command_installs_into_a_venv_of_the_system_python(tmp_path: Path) -> None:
    """The README's first command, as written, with the system's python3 (Debian's refuses `pip install`
    outside a venv, PEP 668), in a copy of this tree: it installs and checks the sample stream."""
    system = Path("/usr/bin/python3")
    if not system.exists() or subprocess.run([system, "-c", "import ensurepip"], capture_output=True).returncode:
        pytest.skip("needs a system python3 with venv (Debian: python3-venv)")
    source = tmp_path / "source"
    shutil.copytree(ROOT / "sendstream", source / "sendstream", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    (source / "fixtures").mkdir()
    shutil.copy2(FIXTURES / "rich-incr-v2.stream", source / "fixtures")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYENV"))}
    env["PATH"] = "/usr/bin:/bin"
    (command,) = commands(example(README, "first-command"), {})
    result = subprocess.run(["sh", "-c", command], cwd=source, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK: 1 stream, 104 commands, 18154 bytes" in result.stdout, result.stdout


# --- the docs held to the code ---


def _floors() -> list[set[str]]:
    """FLOORS of tests/unit/test_layers.py, read (a test module is not imported by another)."""
    tree = ast.parse((ROOT / "tests" / "unit" / "test_layers.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FLOORS" for t in node.targets):
            value: list[set[str]] = ast.literal_eval(node.value)
            return value
    raise AssertionError("tests/unit/test_layers.py has no FLOORS")


def _table(text: str, begin: str, end: str) -> list[list[str]]:
    rows = text[text.index(begin) : text.index(end)].splitlines()[3:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows if row.startswith("|")]


def test_the_architecture_s_floors_are_those_the_layer_test_holds() -> None:
    text = (DOCS / "contributing" / "architecture.md").read_text()
    rows = _table(text, "<!-- floors:", "<!-- /floors -->")
    assert [set(re.findall(r"`([\w.]+)`", row[0])) for row in rows] == _floors()
    words = {1: "One", 12: "Twelve", 13: "Thirteen", 14: "Fourteen", 15: "Fifteen", 16: "Sixteen", 17: "Seventeen"}
    count = words.get(len(rows) - 1, str(len(rows) - 1))
    assert f"{count} floors below the command line" in text


def test_the_layout_names_every_module_and_tool() -> None:
    text = (DOCS / "contributing" / "architecture.md").read_text()
    named: set[Path] = set()
    for row in text[text.index("## Layout") :].splitlines():
        if not row.startswith("| `"):
            continue
        first, *rest = re.findall(r"`([^`]+)`", row.split(" | ")[0])
        base = (ROOT / first).parent
        for name in (first, *rest):
            path = ROOT / name if "/" in name else base / name  # a bare name is in the row's first one's directory
            assert path.exists(), f"the layout names {name}, which is not there"
            named.add(path)
    wanted = [
        p for p in (ROOT / "sendstream").rglob("*") if p.suffix in (".py", ".c", ".h") and "__pycache__" not in p.parts
    ]
    wanted += [p for p in (ROOT / "tools").iterdir() if p.is_file()]
    missing = [
        str(p.relative_to(ROOT))
        for p in wanted
        if p not in named
        and not any(d in named for d in p.parents)
        and not (p.name == "__init__.py" and p.parent != ROOT / "sendstream")
    ]
    assert not missing, f"the layout of docs/contributing/architecture.md lacks {missing}"


def test_ci_runs_the_suite_once_and_leaves_no_test_out() -> None:
    """Both codec backends run in the one pass (the ``backend`` fixture of tests/conftest.py): CI
    neither runs the suite again with SENDSTREAM_PURE nor leaves files out of it."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "SENDSTREAM_PURE" not in ci and "--ignore" not in ci


def test_the_cli_reference_is_made_from_the_declarations_at_build_time() -> None:
    from sendstream.cli import cli
    from sendstream.cli.manual import markdown

    page = (DOCS / "reference" / "cli.md").read_text()
    hooks = runpy.run_path(str(DOCS / "hooks.py"))
    made = hooks["on_page_markdown"](page, page=None)
    assert made == page.replace(hooks["MARKER"], markdown(cli)) and made != page
    for name in ("dump", "verify", "send", "serve", "archive prune", "key fingerprint", "man"):
        assert f"\n## {name}\n" in made
    assert "| `--tls [none|tls12-aes128-gcm|" in made  # in backticks, a choice's | does not end the cell


@pytest.mark.parametrize("page", ["sendstream", "sendstream-serve.toml", "sendstream-backup.toml"])
@pytest.mark.parametrize("width", [60, 80])
def test_the_manual_pages_render_without_a_warning(page: str, width: int) -> None:
    if shutil.which("groff") is None:
        pytest.skip("needs groff (apt-get install groff-base)")
    roff = subprocess.run([sys.executable, "-m", "sendstream", "man", page], capture_output=True, check=True).stdout
    result = subprocess.run(
        ["groff", "-ww", "-z", "-man", "-Tutf8", f"-rLL={width}n"], input=roff, capture_output=True, check=True
    )
    assert result.stderr == b""
    if page == "sendstream":
        for section in ("EXIT STATUS", "ENVIRONMENT", "FILES"):
            assert f"\n.SH {section}\n".encode() in roff
        for name in (b"AWS_ENDPOINT_URL", b"TZ", b"SENDSTREAM_PURE"):
            assert name in roff


def test_the_backup_page_tells_every_setting() -> None:
    from sendstream.backup import config
    from sendstream.cli.manual import BACKUP_SETTINGS, SUBVOLUME_SETTINGS, TARGET_SETTINGS, backup_toml_page

    def names(pairs: tuple[tuple[str, str], ...]) -> set[str]:
        return {name for names, _ in pairs for name in names.split(", ")}

    assert names(BACKUP_SETTINGS) | {"subvolumes", "targets"} == config._TOP
    assert names(SUBVOLUME_SETTINGS) == config._SUBVOLUME
    assert names(TARGET_SETTINGS) == set().union(*config._TARGET.values())
    assert "\\fBfull_every\\fR" in backup_toml_page()


def test_the_configuration_page_tells_every_setting_with_its_default() -> None:
    from sendstream.cli.manual import CLIENT_SETTINGS, SERVE_SETTINGS, serve_toml_page
    from sendstream.service import config

    assert {name for name, _ in SERVE_SETTINGS} | {"clients"} == config._TOP
    assert {name for name, _ in CLIENT_SETTINGS} == config._CLIENT
    page = serve_toml_page()
    for name, (low, high, default) in config.BOUNDS.items():
        assert f"{low:g} to {high:g}, default {default:g}" in page.split(f"\\fB{name}\\fR", 1)[1].split(".TP")[0]
