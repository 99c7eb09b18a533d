"""``python -m devhost --instances N``: the option and the extra runtime processes it plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from devhost.__main__ import build_parser
from devhost.instances import extra_instances
from shared.contract import Setting


def test_instances_default_to_one_and_take_a_count() -> None:
    assert build_parser().parse_args([]).instances == 1
    assert build_parser().parse_args(["--instances", "3"]).instances == 3
    assert build_parser().parse_args(["run", "--instances", "2"]).instances == 2


@pytest.mark.parametrize("count", ["0", "9", "two"])
def test_an_impossible_count_is_refused(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--instances", count])
    assert "--instances" in capsys.readouterr().err


def test_the_extra_instances_start_no_services_and_each_has_its_own_port_and_id(
    tmp_path: Path,
) -> None:
    environ = {Setting.INSTANCE_ID: "laptop"}
    extras = extra_instances(3, state_dir=tmp_path, root=tmp_path, environ=environ)
    assert [e.child.name for e in extras] == ["instance 2", "instance 3"]
    assert len({e.port for e in extras}) == 2
    for n, extra in enumerate(extras, start=2):
        command = extra.child.command
        assert command[1:4] == ("-m", "devhost", "--no-services")
        assert command[command.index("--port") + 1] == str(extra.port)
        assert command[command.index("--root") + 1] == str(tmp_path)
        assert extra.child.env == {Setting.INSTANCE_ID: f"laptop-{n}"}
        assert extra.child.log_path == tmp_path / f"instance-{n}.log"
    assert extra_instances(1, state_dir=tmp_path, root=tmp_path) == []


def test_without_an_instance_id_setting_each_process_makes_up_its_own(tmp_path: Path) -> None:
    (extra,) = extra_instances(2, state_dir=tmp_path, root=tmp_path, environ={})
    assert Setting.INSTANCE_ID not in extra.child.env
