"""The azd hook that takes or makes the operators' app registration (docs/sign-in.md),
run for real with what it would find in an azd environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shared.domain.principal import Role
from tests.infra.deployment import ROOT, load_yaml

HOOK = ROOT / "infra" / "hooks" / "operator-app.sh"


def run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """With PATH holding only a shell's basics, so no az and no azd can be reached."""
    bare = tmp_path / "bin"
    bare.mkdir(exist_ok=True)
    return subprocess.run(
        ["/bin/sh", str(HOOK)],
        env={"PATH": str(bare), "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_azd_runs_the_hook_before_provisioning() -> None:
    hooks = load_yaml(ROOT / "azure.yaml")["hooks"]
    assert hooks["preprovision"]["posix"]["run"] == str(HOOK.relative_to(ROOT))
    assert os.access(HOOK, os.X_OK)


def test_the_roles_it_creates_are_the_roles_the_app_checks() -> None:
    text = HOOK.read_text(encoding="utf-8")
    for role in Role:
        assert f'"value": "{role.value}"' in text


def test_without_operator_auth_it_does_nothing(tmp_path: Path) -> None:
    done = run({}, tmp_path)
    assert done.returncode == 0 and "off" in done.stdout


def test_a_given_app_registration_is_taken_as_it_is(tmp_path: Path) -> None:
    done = run({"OPERATOR_AUTH": "token", "OPERATOR_AUTH_CLIENT_ID": "1111"}, tmp_path)
    assert done.returncode == 0 and "app registration 1111" in done.stdout


@pytest.mark.parametrize("mode", ["token", "platform"])
def test_making_one_without_the_azure_cli_stops_with_one_sentence(
    tmp_path: Path, mode: str
) -> None:
    done = run({"OPERATOR_AUTH": mode}, tmp_path)
    assert done.returncode == 1
    assert "needs the Azure CLI (az)" in done.stderr and "OPERATOR_AUTH_CLIENT_ID" in done.stderr
