"""Settings precedence: environment over local.settings.json over the sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devhost.settings import SettingsError, apply_to_environ, load_settings


def write(path: Path, values: dict[str, Any], **extra: Any) -> None:
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values, **extra}))


def test_sample_is_used_when_no_local_file(tmp_path: Path) -> None:
    write(tmp_path / "local.settings.sample.json", {"A": "sample"})
    settings = load_settings(tmp_path, environ={})
    assert settings.values == {"A": "sample"}
    assert settings.source == tmp_path / "local.settings.sample.json"


def test_local_file_replaces_sample_entirely(tmp_path: Path) -> None:
    write(tmp_path / "local.settings.sample.json", {"A": "sample", "OnlyInSample": "x"})
    write(tmp_path / "local.settings.json", {"A": "local"})
    settings = load_settings(tmp_path, environ={})
    # Core Tools reads one file; the sample is a template, not a fallback layer.
    assert settings.values == {"A": "local"}
    assert settings.source == tmp_path / "local.settings.json"


def test_environment_overrides_file_values(tmp_path: Path) -> None:
    write(tmp_path / "local.settings.json", {"A": "local", "B": "local"})
    settings = load_settings(tmp_path, environ={"A": "env", "UNRELATED": "1"})
    assert settings.values == {"A": "env", "B": "local"}


def test_no_files_gives_empty_values(tmp_path: Path) -> None:
    settings = load_settings(tmp_path, environ={"A": "env"})
    assert settings.values == {}
    assert settings.source is None


def test_scalars_are_stringified_and_nulls_dropped(tmp_path: Path) -> None:
    write(
        tmp_path / "local.settings.json",
        {"Count": 3, "Flag": True, "Ratio": 0.5, "Nothing": None},
        Host={"LocalHttpPort": 7090},
    )
    settings = load_settings(tmp_path, environ={})
    assert settings.values == {"Count": "3", "Flag": "true", "Ratio": "0.5"}
    assert settings.local_http_port == 7090


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"Values": [1]}', '{"Values": {"A": {"nested": 1}}}']
)
def test_unusable_files_fail_clearly(tmp_path: Path, content: str) -> None:
    (tmp_path / "local.settings.json").write_text(content)
    with pytest.raises(SettingsError, match=r"local\.settings\.json"):
        load_settings(tmp_path, environ={})


def test_apply_to_environ_publishes_values() -> None:
    environ: dict[str, str] = {"KEEP": "1"}
    apply_to_environ({"A": "x", "B": "y"}, environ)
    assert environ == {"KEEP": "1", "A": "x", "B": "y"}
