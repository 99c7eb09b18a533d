"""bin/prerequisites and bin/setup on machines we do not have, and bin/demo on a fresh
clone, without installing anything: each runs for real in a copy of the repo's scripts
on a PATH of stand-ins (a python3 that says 3.13, a node that says v18, a pip and npm that
write down what they were asked to install) and the few system tools the scripts use."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra.deployment import ROOT, function_app

# The system tools the scripts call; python, node, npm, cc and apt-get are stand-ins.
SYSTEM_TOOLS = (
    "bash",
    "env",
    "cat",
    "cmp",
    "cp",
    "dirname",
    "id",
    "uname",
    "mkdir",
    "touch",
    "chmod",
    "basename",
    "mktemp",
    "rm",
)
REPO_FILES = (
    "bin/prerequisites",
    "bin/setup",
    "bin/demo",
    "package.json",
    "package-lock.json",
    *(p.name for p in ROOT.glob("requirements*.txt")),
)

# A python stand-in: answers the scripts' questions as the given version would, and makes
# a venv whose python records every pip install (and cannot import proton: a fresh .venv).
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  *version_info*) echo {version} ;;
  *sysconfig*) echo {include} ;;
  "-m venv "*)
    mkdir -p "$3/bin"
    printf '#!/usr/bin/env bash\\ncase "$*" in -c*) exit 1 ;; esac\\necho "$0 $*" >> {log}\\n' \
      > "$3/bin/python"
    chmod +x "$3/bin/python" ;;
esac
"""
FAKE_NPM = """#!/usr/bin/env bash
echo "npm $*" >> {log}
mkdir -p node_modules/.bin && touch node_modules/.bin/azurite node_modules/.package-lock.json
chmod +x node_modules/.bin/azurite
"""
RECORDER = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >> {log}\n'
PYENV_SHIM = (
    '#!/usr/bin/env bash\necho "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n'
)


@dataclass
class Machine:
    """A fresh clone's scripts under `root`, and a PATH of stand-ins under `bin`."""

    root: Path
    bin: Path
    log: Path
    include: Path

    def tool(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(text.format(log=self.log, include=self.include))
        path.chmod(0o755)
        return path

    def python(self, name: str, version: str) -> Path:
        return self.tool(name, FAKE_PYTHON.replace("{version}", version))

    def node(self, version: str) -> None:
        self.tool("node", f"#!/usr/bin/env bash\necho {version}\n")

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.root / script), *args],
            cwd=self.root,
            env={"PATH": str(self.bin), "HOME": str(self.root), **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def installed(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A machine with python3.12, Node 22, npm, a C compiler and Python's headers."""
    root, tools = tmp_path / "clone", tmp_path / "bin"
    for name in REPO_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    tools.mkdir()
    for name in SYSTEM_TOOLS:
        found = shutil.which(name)
        assert found, f"{name} is not on this machine"
        os.symlink(found, tools / name)
    include = tmp_path / "include"
    include.mkdir()
    (include / "Python.h").touch()
    m = Machine(root, tools, tmp_path / "installed.log", include)
    m.python("python3.12", "3.12")
    m.node("v22.11.0")
    m.tool("npm", FAKE_NPM)
    for name in ("cc", "apt-get"):
        m.tool(name, RECORDER)
    return m


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"not one line: {result.stderr}"
    return lines[0]


# Python ---------------------------------------------------------------------------------


def test_a_python3_of_313_alone_stops_setup_with_one_line_on_what_to_install(
    machine: Machine,
) -> None:
    (machine.bin / "python3.12").unlink()
    machine.python("python3", "3.13")
    line = one_line(machine.run("bin/setup", "demo"))
    assert "Python 3.11 or 3.12" in line and "found only python3 (3.13)" in line
    assert "apt-get install python3.12" in line and "brew install python@3.12" in line
    assert not (machine.root / ".venv").exists() and machine.installed() == []


def test_an_installed_python312_is_picked_over_a_python3_of_313(machine: Machine) -> None:
    machine.python("python3", "3.13")
    result = machine.run("bin/prerequisites")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(machine.bin / "python3.12")


def test_python312_is_preferred_where_both_supported_versions_are_installed(
    machine: Machine,
) -> None:
    """Azure runs 3.12 (infra/app/function.bicep), so the tests do where they can."""
    machine.python("python3", "3.11")
    machine.python("python3.11", "3.11")
    assert machine.run("bin/prerequisites").stdout.strip() == str(machine.bin / "python3.12")


def test_azure_runs_the_python_setup_prefers() -> None:
    """Deployed and tested on one version where the machine has it (docs/deploy.md)."""
    runtime = function_app().properties["functionAppConfig"]
    assert isinstance(runtime, dict)
    script = (ROOT / "bin" / "prerequisites").read_text()
    assert runtime["runtime"] == {"name": "python", "version": "3.12"}
    assert "candidates=(python3.12 python3.11 python3)" in script


def test_a_pyenv_shim_of_another_version_is_passed_over(machine: Machine) -> None:
    """pyenv puts python3.12 on PATH even where it only runs another version."""
    machine.tool("python3.12", PYENV_SHIM)
    machine.python("python3.11", "3.11")
    assert machine.run("bin/prerequisites").stdout.strip() == str(machine.bin / "python3.11")


def test_python_names_an_unsupported_choice(machine: Machine) -> None:
    chosen = machine.python("python3.13", "3.13")
    line = one_line(machine.run("bin/prerequisites", PYTHON=str(chosen)))
    assert f"PYTHON={chosen} is Python 3.13, and azure-functions 1.26.0 needs" in line


def test_a_venv_of_313_is_named_with_what_to_do(machine: Machine) -> None:
    venv = machine.root / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(FAKE_PYTHON.replace("{version}", "3.13"))
    (venv / "python").chmod(0o755)
    line = one_line(machine.run("bin/setup", "demo"))
    assert ".venv has Python 3.13" in line and "delete .venv" in line


# Node and the C compiler ----------------------------------------------------------------


def test_node_18_stops_setup_and_node_20_runs_with_a_warning(machine: Machine) -> None:
    machine.node("v18.19.0")
    line = one_line(machine.run("bin/prerequisites"))
    assert "Node.js 22 or later" in line and "found v18.19.0" in line
    machine.node("v20.20.2")
    result = machine.run("bin/prerequisites")
    assert result.returncode == 0 and "WARNING: Node.js v20.20.2" in result.stderr


def test_no_node_stops_setup(machine: Machine) -> None:
    (machine.bin / "node").unlink()
    assert "found no node" in one_line(machine.run("bin/prerequisites"))


def test_the_node_it_asks_for_is_the_one_the_pinned_azurite_declares() -> None:
    lock = json.loads((ROOT / "package-lock.json").read_text())
    engines = lock["packages"]["node_modules/azurite"]["engines"]["node"]
    script = (ROOT / "bin" / "prerequisites").read_text()
    wanted = re.search(r"^NODE_MIN=(\d+)$", script, re.MULTILINE)
    assert wanted and engines == f">={wanted.group(1)}.0.0", engines


def test_no_c_compiler_stops_setup_naming_proton(machine: Machine) -> None:
    (machine.bin / "cc").unlink()
    line = one_line(machine.run("bin/setup", "demo"))
    assert "python-qpid-proton 0.40.0 is built from source" in line
    assert "build-essential python3.12-dev" in line and "xcode-select --install" in line


def test_no_python_headers_stop_setup(machine: Machine) -> None:
    (machine.include / "Python.h").unlink()
    assert "Python 3.12's headers" in one_line(machine.run("bin/setup", "demo"))


# What bin/demo and bin/test install -----------------------------------------------------

TEST_TOOLS = ("checkov", "playwright", "schemathesis", "mypy", "pytest", "hypothesis", "ruff")


def requirements(name: str) -> set[str]:
    """The packages a requirements file installs, its -r includes followed."""
    found: set[str] = set()
    for text in (ROOT / name).read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found |= requirements(line[3:].strip())
        elif line:
            found.add(re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower())
    return found


def pip_files(installed: list[str]) -> list[str]:
    return [line.rsplit(" -r ", 1)[1] for line in installed if " -m pip install " in line]


def test_bin_demo_on_a_fresh_clone_installs_only_what_the_demo_runs(machine: Machine) -> None:
    result = machine.run("bin/demo", "--orders", "5")
    assert result.returncode == 0, result.stderr
    installed = machine.installed()
    assert pip_files(installed) == ["requirements-devhost.txt"], installed
    assert "npm ci --no-audit --no-fund" in installed
    assert installed[-1].endswith(".venv/bin/python -m devhost demo --orders 5")
    assert not (machine.root / ".venv-checkov").exists()
    assert not any(line.startswith("apt-get") for line in installed), "no browser for the demo"
    packages = requirements("requirements-devhost.txt")
    assert not packages & set(TEST_TOOLS), packages & set(TEST_TOOLS)
    assert "python-qpid-proton" in packages, "the local broker runs on proton"


def test_bin_setup_test_adds_the_test_toolchain_and_checkov(machine: Machine) -> None:
    result = machine.run("bin/setup", "test")
    assert result.returncode == 0, result.stderr
    files = sorted(pip_files(machine.installed()))  # the installs run side by side
    assert files == ["requirements-checkov.txt", "requirements-dev.txt"], files
    assert (machine.root / ".venv-checkov" / "requirements-checkov.txt").is_file()
    assert set(TEST_TOOLS) - {"checkov"} <= requirements("requirements-dev.txt")
    assert requirements("requirements-devhost.txt") <= requirements("requirements-dev.txt")
