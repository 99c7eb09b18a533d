"""The test files' start order of a parallel run (tests/schedule.py)."""

from __future__ import annotations

from pathlib import Path

from tests import schedule

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_in_the_durations_list_still_exists() -> None:
    listed = schedule.load_weights()
    assert listed, "tests/durations.txt is missing or empty"
    gone = sorted(path for path in listed if not (ROOT / path).is_file())
    assert not gone, f"tests/durations.txt names files that are gone (refresh it): {gone}"


def test_heaviest_files_first_each_files_tests_together_and_in_order() -> None:
    items = ["a.py::1", "a.py::2", "b.py::1", "c.py::1", "c.py::2", "c.py::3"]
    weights = {"a.py": 5.0, "b.py": 50.0, "c.py": 20.0}

    got = schedule.ordered(items, lambda item: item.split("::")[0], weights)

    assert got == ["b.py::1", "c.py::1", "c.py::2", "c.py::3", "a.py::1", "a.py::2"]


def test_files_of_equal_weight_keep_their_collection_order() -> None:
    items = ["z.py::1", "a.py::1", "m.py::1"]
    weights = {"z.py": 3.0, "a.py": 3.0, "m.py": 3.0}

    assert schedule.ordered(items, lambda item: item.split("::")[0], weights) == items


def test_an_unlisted_e2e_file_is_weighed_by_its_tests_and_starts_before_light_ones() -> None:
    items = ["tests/unit/test_x.py::1", "tests/e2e/test_new.py::1", "tests/e2e/test_new.py::2"]
    weights = {"tests/unit/test_x.py": 2.0}

    got = schedule.ordered(items, lambda item: item.split("::")[0], weights)

    assert got[0].startswith("tests/e2e/test_new.py")
    assert schedule.guessed_weight("tests/e2e/test_new.py", 2) > 2.0
    assert schedule.guessed_weight("tests/unit/test_y.py", 2) < 2.0


def test_the_refresh_sums_a_files_tests_from_junit_and_writes_what_is_read_back(
    tmp_path: Path,
) -> None:
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "test_slow.py").write_text("")
    (tmp_path / "tests" / "test_quick.py").write_text("")
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.test_slow" name="test_a" time="12.5"/>'
        '<testcase classname="tests.e2e.test_slow.TestGroup" name="test_b" time="7.5"/>'
        '<testcase classname="tests.test_quick" name="test_c" time="0.2"/>'
        "</testsuite></testsuites>"
    )

    totals = schedule.totals_from_junit([junit], tmp_path)

    assert totals == {"tests/e2e/test_slow.py": 20.0, "tests/test_quick.py": 0.2}
    assert schedule.read_weights(schedule.as_text(totals)) == totals
