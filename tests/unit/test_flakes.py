"""The flake finder's reading of JUnit reports and its counts (bin/flakes, tests/flakes.py),
on small reports written here in pytest's shapes: no pytest is run."""

from __future__ import annotations

from pathlib import Path

from tests.flakes import Flake, Run, exit_code, flakes, read_report, summary

PARAM = "tests/e2e/test_a.py::TestK::test_p[2]"
TEARDOWN = "tests/e2e/test_a.py::test_td"
STEADY = "tests/e2e/test_a.py::test_ok"
SKIPPED = "tests/e2e/test_a.py::test_skip"
LATE = "tests/e2e/test_c.py::test_last"
BROKEN_MODULE = "tests/e2e/test_b.py"


def case(name: str, body: str = "", *, file: str = "tests/e2e/test_a.py", cls: str = "") -> str:
    module = file.removesuffix(".py").replace("/", ".")
    classname = f"{module}.{cls}" if cls else module
    return (
        f'<testcase classname="{classname}" name="{name}" file="{file}" line="3" time="0.1">'
        f"{body}</testcase>"
    )


def report(tmp_path: Path, name: str, *cases: str) -> Path:
    path = tmp_path / f"{name}.xml"
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" errors="0" failures="0" tests="{len(cases)}">'
        f"{''.join(cases)}</testsuite></testsuites>"
    )
    return path


ASSERTION = (
    '<failure message="AssertionError: x should be one&#10;  second line&#10;assert 2 == 1">'
    "&gt;       assert x == 1\nE       AssertionError: x should be one\n</failure>"
)
TEARDOWN_ERROR = (
    '<error message="failed on teardown with &quot;RuntimeError: teardown boom&quot;">'
    "E       RuntimeError: teardown boom</error>"
)
SKIP = '<skipped type="pytest.skip" message="nope">tests/e2e/test_a.py:13: nope</skipped>'
COLLECTION = (
    '<testcase classname="" name="tests.e2e.test_b" file="tests/e2e/test_b.py" time="0">'
    '<error message="collection failure">ImportError while importing test module.\n'
    "Traceback:\ntests/e2e/test_b.py:1: in &lt;module&gt;\n"
    "E   ModuleNotFoundError: No module named 'nowhere'</error></testcase>"
)
TIMEOUT = '<failure message="Failed: Timeout (&gt;300.0s) from pytest-timeout.">+++</failure>'


def run(number: int, path: Path | None, *, exit_status: int | None = 1, **kw: bool) -> Run:
    return Run(
        number=number,
        seconds=12.5,
        load_start=0.5,
        load_end=1.75,
        hog=kw.get("hog", True),
        hog_cpu_seconds=12.0,
        exit_code=exit_status,
        timed_out=kw.get("timed_out", False),
        outcomes=read_report(path) if path is not None else None,
    )


def three_runs(tmp_path: Path) -> list[Run]:
    """PARAM fails in runs 1 and 3, TEARDOWN only in run 2 (a passed call, then its
    teardown's error, reported apart), the module BROKEN_MODULE fails to import in run 2
    only, LATE is reported by runs 1 and 2 and fails in run 2, STEADY and SKIPPED never fail."""
    first = report(
        tmp_path,
        "run-1",
        case("test_p[1]", cls="TestK"),
        case("test_p[2]", ASSERTION, cls="TestK"),
        case("test_td"),
        case("test_ok"),
        case("test_skip", SKIP),
        case("test_last", file="tests/e2e/test_c.py"),
    )
    second = report(
        tmp_path,
        "run-2",
        case("test_p[1]", cls="TestK"),
        case("test_p[2]", cls="TestK"),
        case("test_td"),
        case("test_td", TEARDOWN_ERROR),
        case("test_ok"),
        case("test_skip", SKIP),
        COLLECTION,
        case("test_last", TIMEOUT, file="tests/e2e/test_c.py"),
    )
    third = report(
        tmp_path,
        "run-3",
        case("test_p[1]", cls="TestK"),
        case("test_p[2]", ASSERTION, cls="TestK"),
        case("test_td"),
        case("test_ok"),
        case("test_skip", SKIP),
    )
    return [run(1, first), run(2, second), run(3, third)]


def test_each_test_that_failed_is_counted_once_per_run_out_of_the_runs_that_reported_it(
    tmp_path: Path,
) -> None:
    assert flakes(three_runs(tmp_path)) == [
        Flake(PARAM, 2, 3, "AssertionError: x should be one", 0),
        Flake(TEARDOWN, 1, 3, 'failed on teardown with "RuntimeError: teardown boom"', 0),
        Flake(BROKEN_MODULE, 1, 1, "ModuleNotFoundError: No module named 'nowhere'", 0),
        Flake(LATE, 1, 2, "Failed: Timeout (>300.0s) from pytest-timeout.", 0),
    ]


def test_each_run_counts_passed_failed_and_skipped_tests_once(tmp_path: Path) -> None:
    runs = three_runs(tmp_path)
    assert [(r.passed, r.failed, r.skipped) for r in runs] == [(4, 1, 1), (3, 3, 1), (3, 1, 1)]
    outcomes = runs[1].outcomes
    assert outcomes is not None
    assert sorted(o.node_id for o in outcomes if o.failed) == [TEARDOWN, BROKEN_MODULE, LATE]
    assert STEADY in {o.node_id for o in outcomes} and SKIPPED in {o.node_id for o in outcomes}


def test_a_test_reported_twice_in_one_run_failed_there_once_whichever_came_first(
    tmp_path: Path,
) -> None:
    path = report(
        tmp_path,
        "twice",
        case("test_td"),
        case("test_td", TEARDOWN_ERROR),
        case("test_ok", TIMEOUT),
        case("test_ok"),
    )
    twice = run(1, path)
    assert (twice.passed, twice.failed, twice.skipped) == (0, 2, 0)
    assert [(f.node_id, f.failures, f.runs) for f in flakes([twice])] == [
        (STEADY, 1, 1),
        (TEARDOWN, 1, 1),
    ]


def test_different_messages_of_one_test_are_counted_and_the_first_is_shown(
    tmp_path: Path,
) -> None:
    other = '<failure message="AssertionError: assert 3 == 1">E   assert 3 == 1</failure>'
    once = case("test_x", TIMEOUT, file="tests/e2e/test_0.py")
    runs = [
        run(1, report(tmp_path, "a", case("test_p[2]", ASSERTION, cls="TestK"), once)),
        run(2, report(tmp_path, "b", case("test_p[2]", other, cls="TestK"))),
        run(3, report(tmp_path, "c", case("test_p[2]", ASSERTION, cls="TestK"))),
    ]
    # The most failures first, though test_0 comes first by name.
    assert flakes(runs) == [
        Flake(PARAM, 3, 3, "AssertionError: x should be one", 1),
        Flake(
            "tests/e2e/test_0.py::test_x", 1, 1, "Failed: Timeout (>300.0s) from pytest-timeout.", 0
        ),
    ]


def test_the_summary_names_each_run_and_each_failed_test_with_its_count_and_message(
    tmp_path: Path,
) -> None:
    text = summary(three_runs(tmp_path), planned=3)
    assert "== 3 of 3 runs" in text
    assert (
        "run 2/3: 12.5 s, 3 passed, 3 failed, 1 skipped; load 0.50 -> 1.75; "
        "hog on (12.0 s CPU)" in text
    )
    assert "== 4 of 7 tests failed at least once" in text
    lines = text.splitlines()
    at = lines.index(f"  2/3  {PARAM}")
    assert lines[at + 1] == "       AssertionError: x should be one"
    assert f"  1/2  {LATE}" in lines
    assert STEADY not in text and SKIPPED not in text
    assert "incomplete" not in text


def test_it_exits_1_when_any_test_failed_once_and_0_when_none_did(tmp_path: Path) -> None:
    assert exit_code(three_runs(tmp_path)) == 1
    clean = [run(n, report(tmp_path, f"ok-{n}", case("test_ok")), exit_status=0) for n in (1, 2)]
    assert flakes(clean) == []
    assert exit_code(clean) == 0
    assert "== no test failed (1 tests)" in summary(clean, planned=2)


def test_a_run_stopped_at_its_timeout_or_without_a_report_fails_the_whole(
    tmp_path: Path,
) -> None:
    # The test a stopped run interrupted is left nameless: not a test of its own.
    passing = report(tmp_path, "ok", case("test_ok"), '<testcase time="0.000" />')
    garbled = tmp_path / "garbled.xml"
    garbled.write_text("<testsuites><testsuite>")
    stopped = run(2, passing, exit_status=None, timed_out=True)
    unreadable = run(3, garbled, exit_status=2)
    assert unreadable.outcomes is None
    assert stopped.problem == "stopped at its timeout"
    assert unreadable.problem == "no JUnit report (pytest exit code 2)"
    assert (stopped.passed, stopped.failed, stopped.skipped) == (1, 0, 0)
    runs = [run(1, passing, exit_status=0), stopped, unreadable]
    assert flakes(runs) == []
    assert exit_code(runs) == 1
    assert "== incomplete runs: run 2: stopped at its timeout, run 3: no JUnit" in (
        summary(runs, planned=3)
    )


def test_node_ids_without_a_file_attribute_come_from_the_classname(tmp_path: Path) -> None:
    path = report(
        tmp_path,
        "xunit2",
        f'<testcase classname="tests.e2e.test_a.TestK" name="test_p[2]">{ASSERTION}</testcase>',
        '<testcase classname="tests.e2e.test_a" name="test_ok"/>',
    )
    outcomes = read_report(path)
    assert outcomes is not None
    assert [o.node_id for o in outcomes] == [PARAM, STEADY]
