"""The flake finder of `bin/flakes`: runs the chosen tests k times, each run a separate
pytest process with a JUnit report, optionally beside a CPU hog, then names every test
that failed at least once (how often, and its first message line) and each run's
duration, counts and load.

`python -m tests.flakes --help` lists the options; anything it does not know goes to
pytest (after `--`, everything does, e.g. `-- -k name`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]

# The suites by name: the e2e suite as bin/test runs it (its slow files stay out), and the
# slow suites of `bin/test -m slow`.
SUITES = {"e2e": "e2e and not slow", "slow": "slow"}
DEFAULT_RUNS = 5
DEFAULT_RUN_TIMEOUT = 1800.0
# After a run's timeout or a Ctrl-C: SIGINT first (pytest tears its fixtures down, stops
# the stacks it started and writes its report), SIGTERM after this, SIGKILL after as long.
STOP_GRACE_SECONDS = 60.0
MESSAGE_WIDTH = 200
PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent dies

# A busy loop on one core. It ends by itself when its parent is gone (a flake finder
# killed with SIGKILL) or after its time limit, so it never outlives the run.
HOG_SOURCE = """
import os, sys, time
parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(200_000):
        pass
"""


# --- reading the JUnit reports and summing them up ------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One test's result in one run: failed covers failures and errors (setup, teardown,
    collection); message is the first line of the first one ("" when it did not fail)."""

    node_id: str
    failed: bool
    skipped: bool
    message: str = ""


@dataclass(frozen=True)
class Run:
    """One pytest process: outcomes is None when it left no readable report; exit_code is
    None when it was stopped (its timeout or a Ctrl-C)."""

    number: int
    seconds: float
    load_start: float
    load_end: float
    hog: bool
    hog_cpu_seconds: float | None
    exit_code: int | None
    timed_out: bool
    outcomes: tuple[Outcome, ...] | None

    @property
    def passed(self) -> int:
        return sum(1 for o in self.outcomes or () if not o.failed and not o.skipped)

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes or () if o.failed)

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.outcomes or () if o.skipped and not o.failed)

    @property
    def interrupted(self) -> bool:
        return self.exit_code is None and not self.timed_out

    @property
    def problem(self) -> str | None:
        """Why this run cannot be trusted as a whole, beyond its failed tests."""
        if self.timed_out:
            return "stopped at its timeout"
        if self.interrupted:
            return "stopped (Ctrl-C)"
        if self.outcomes is None:
            return f"no JUnit report (pytest exit code {self.exit_code})"
        if self.exit_code not in (0, 1):
            return f"pytest exit code {self.exit_code}"
        if self.exit_code == 1 and not self.failed:
            return "pytest exit code 1 but no failed test in its report"
        return None


@dataclass(frozen=True)
class Flake:
    """A test that failed at least once: `failures` of the `runs` that reported it."""

    node_id: str
    failures: int
    runs: int
    message: str
    other_messages: int


def node_id(testcase: ET.Element) -> str:
    """pytest's node id back from a testcase: its `file` (xunit1) and its classname, the
    module's dotted path then any classes, e.g. tests.e2e.test_x.TestK -> ::TestK."""
    classname = testcase.get("classname", "")
    name = testcase.get("name", "")
    path = testcase.get("file")
    if path is None:
        # No file (xunit2): the classname's parts up to the last test_* module.
        parts = classname.split(".") if classname else []
        modules = [i for i, part in enumerate(parts) if part.startswith("test")]
        cut = modules[-1] + 1 if modules else len(parts)
        path = "/".join(parts[:cut]) + ".py" if parts[:cut] else ""
        classes = parts[cut:]
    else:
        module = path.removesuffix(".py").replace("/", ".")
        rest = classname[len(module) :] if classname.startswith(module) else ""
        classes = rest.strip(".").split(".")
    if not classname:
        # A collection error: the testcase is the module itself.
        return path or name
    return "::".join([path, *filter(None, classes), name])


def first_line(problem: ET.Element) -> str:
    """The first line of a failure or error: its message, or for a collection failure
    (whose message says only that) the first `E ` line of the traceback."""
    message = (problem.get("message") or "").strip()
    if message and message != "collection failure":
        line = message.splitlines()[0].strip()
    else:
        text_lines = (problem.text or "").splitlines()
        errors = [line[1:].strip() for line in text_lines if line.startswith("E ")]
        fallback = [line.strip() for line in text_lines if line.strip()]
        line = (errors or fallback or [message or problem.tag])[0]
    return line if len(line) <= MESSAGE_WIDTH else line[: MESSAGE_WIDTH - 3] + "..."


def read_report(path: Path) -> tuple[Outcome, ...] | None:
    """Every test of one run's JUnit XML, once each (None when missing or unreadable)."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return None
    found: dict[str, Outcome] = {}
    for testcase in tree.getroot().iter("testcase"):
        if not testcase.get("name"):
            continue  # the test a SIGINT interrupted: pytest leaves it nameless
        problems = [child for child in testcase if child.tag in ("failure", "error")]
        outcome = Outcome(
            node_id=node_id(testcase),
            failed=bool(problems),
            skipped=testcase.find("skipped") is not None,
            message=first_line(problems[0]) if problems else "",
        )
        earlier = found.get(outcome.node_id)
        # The same id twice (a teardown error reported apart): failed if either failed.
        if earlier is None or (outcome.failed and not earlier.failed):
            found[outcome.node_id] = outcome
    return tuple(found.values())


def flakes(runs: Sequence[Run]) -> list[Flake]:
    """The tests that failed in at least one run, most failures first."""
    seen: dict[str, int] = {}
    messages: dict[str, list[str]] = {}
    for run in runs:
        for outcome in run.outcomes or ():
            seen[outcome.node_id] = seen.get(outcome.node_id, 0) + 1
            if outcome.failed:
                messages.setdefault(outcome.node_id, []).append(outcome.message)
    found = [
        Flake(
            node_id=node,
            failures=len(lines),
            runs=seen[node],
            message=lines[0],
            other_messages=len(set(lines)) - 1,
        )
        for node, lines in messages.items()
    ]
    return sorted(found, key=lambda flake: (-flake.failures, flake.node_id))


def exit_code(runs: Sequence[Run]) -> int:
    """1 when a test failed at least once or a run did not finish cleanly, else 0."""
    return 1 if not runs or flakes(runs) or any(run.problem for run in runs) else 0


def _hog_text(run: Run) -> str:
    if not run.hog:
        return "no hog"
    if run.hog_cpu_seconds is None:
        return "hog on"
    return f"hog on ({run.hog_cpu_seconds:.1f} s CPU)"


def run_line(run: Run, total: int) -> str:
    counts = (
        "no report"
        if run.outcomes is None
        else f"{run.passed} passed, {run.failed} failed, {run.skipped} skipped"
    )
    line = (
        f"run {run.number}/{total}: {run.seconds:.1f} s, {counts}; "
        f"load {run.load_start:.2f} -> {run.load_end:.2f}; {_hog_text(run)}"
    )
    return line if run.problem is None else f"{line}; {run.problem}"


def summary(runs: Sequence[Run], planned: int) -> str:
    """The report printed at the end: each run, then each test that failed at least once."""
    lines = [f"== {len(runs)} of {planned} runs"]
    lines += [f"  {run_line(run, planned)}" for run in runs]
    found = flakes(runs)
    tests = len({o.node_id for run in runs for o in run.outcomes or ()})
    if not found:
        lines.append(f"== no test failed ({tests} tests)")
    else:
        lines.append(f"== {len(found)} of {tests} tests failed at least once")
        width = max(len(f"{f.failures}/{f.runs}") for f in found)
        for flake in found:
            count = f"{flake.failures}/{flake.runs}".rjust(width)
            lines.append(f"  {count}  {flake.node_id}")
            more = f"  (+{flake.other_messages} other messages)" if flake.other_messages else ""
            lines.append(f"  {' ' * width}  {flake.message}{more}")
    problems = [run for run in runs if run.problem]
    if problems:
        names = ", ".join(f"run {run.number}: {run.problem}" for run in problems)
        lines.append(f"== incomplete runs: {names}")
    return "\n".join(lines)


# --- running pytest and the hog -------------------------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    """A process's user + system CPU time from /proc (None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Hog:
    """A child process keeping one core busy until stop() (or its time limit)."""

    def __init__(self, limit_seconds: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOG_SOURCE, str(limit_seconds)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches the flake finder only, which stops it
        )

    def running(self) -> bool:
        return self.process.poll() is None

    def cpu_seconds(self) -> float | None:
        return _cpu_seconds(self.process.pid) if self.running() else None

    def stop(self) -> None:
        if self.running():
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def hog_beside(enabled: bool, limit_seconds: float) -> Iterator[Hog | None]:
    hog = Hog(limit_seconds) if enabled else None
    try:
        yield hog
    finally:
        if hog is not None:
            hog.stop()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def stop_run(process: subprocess.Popen[bytes]) -> None:
    """SIGINT the run's process group (as a Ctrl-C would), then SIGTERM, then SIGKILL.
    A second Ctrl-C while it winds down goes straight to SIGKILL."""
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if process.poll() is not None:
                return
            _signal_group(process, signum)
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                continue
        if process.poll() is None:
            print(f"flakes: pytest (pid {process.pid}) ignored SIGINT and SIGTERM: SIGKILL")
    finally:
        if process.poll() is None:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _before_pytest(parent: int) -> None:
    """In the run's process, before pytest starts: Ctrl-C's default back (started in the
    background, the flake finder may have SIGINT ignored, which pytest would inherit), and
    on Linux a SIGINT when the flake finder dies, so that a killed flake finder leaves no
    run behind (pytest then stops as on a Ctrl-C, tearing its stacks down)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGINT)
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGINT)


def pytest_command(suite: str | None, pytest_args: Sequence[str], report: Path) -> list[str]:
    workers = os.environ.get("PYTEST_WORKERS", "3")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    command += ["-n", workers, "--dist", "loadfile", "--no-loadscope-reorder"]
    command += [f"--junitxml={report}"]  # files heaviest first, as in bin/test
    command += ["-o", "junit_family=xunit1"]  # its testcases carry their file
    if suite is not None:
        command += ["-m", SUITES[suite]]
    return command + list(pytest_args)


def run_once(
    number: int, command: list[str], log: Path, report: Path, timeout: float, hog: Hog | None
) -> Run:
    load_start = os.getloadavg()[0]
    hog_start = hog.cpu_seconds() if hog is not None else None
    hog_on = hog is not None and hog.running()
    started = time.monotonic()
    exit_status: int | None = None
    timed_out = False
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, stopped as a whole at the timeout
            preexec_fn=partial(_before_pytest, os.getpid()),  # noqa: PLW1509 - no threads here
        )
        try:
            exit_status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_run(process)
        except KeyboardInterrupt:
            # Ctrl-C: this run stops too (its report keeps what it finished), and so does
            # the flake finder after it (exit_code None, not timed out).
            stop_run(process)
    seconds = time.monotonic() - started
    hog_end = hog.cpu_seconds() if hog is not None else None
    return Run(
        number=number,
        seconds=seconds,
        load_start=load_start,
        load_end=os.getloadavg()[0],
        hog=hog_on and hog is not None and hog.running(),
        hog_cpu_seconds=None if hog_start is None or hog_end is None else hog_end - hog_start,
        exit_code=exit_status,
        timed_out=timed_out,
        outcomes=read_report(report),
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="bin/flakes",
        usage="%(prog)s [-k RUNS] [--suite {e2e,slow}] [--hog] [--run-timeout SECONDS] "
        "[--out DIR] [pytest args] [-- pytest args]",
        allow_abbrev=False,
        description="Run tests k times, each run a separate pytest process, and name every "
        "test that failed at least once. Default: the e2e suite (-m 'e2e and not slow'). "
        "Other arguments go to pytest (everything after --, e.g. -- -k name).",
    )
    parser.add_argument("-k", "--runs", type=int, default=DEFAULT_RUNS, help="runs (default 5)")
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        help="e2e: -m 'e2e and not slow' (the default when no pytest arguments are given); "
        "slow: -m slow",
    )
    parser.add_argument("--hog", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=DEFAULT_RUN_TIMEOUT,
        metavar="SECONDS",
        help="stop a run after this long (default 1800)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for the reports (default .artifacts/flakes/<time>)",
    )
    argv = list(argv)
    after_dashes = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    args, extra = parser.parse_known_args(ours)
    if not 1 <= args.runs <= 100:
        parser.error("-k must be between 1 and 100")
    if args.run_timeout <= 0:
        parser.error("--run-timeout must be positive")
    pytest_args = extra + after_dashes
    if args.suite is None and not pytest_args:
        args.suite = "e2e"
    return args, pytest_args


def main(argv: Sequence[str]) -> int:
    args, pytest_args = parse(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out: Path = (args.out or ROOT / ".artifacts" / "flakes" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # where pytest runs, so the paths printed are short and work in both
    if out.is_relative_to(ROOT):
        out = out.relative_to(ROOT)
    width = len(str(args.runs))
    shown = pytest_command(args.suite, pytest_args, out / "run-N.xml")
    print(f"flakes: {args.runs} runs of: pytest {shlex.join(shown[3:])}")
    print(
        f"flakes: each stopped after {args.run_timeout:.0f} s; "
        f"{'a CPU hog on one core' if args.hog else 'no CPU hog'}; "
        f"{os.cpu_count()} cores; logs and reports in {out}"
    )
    signal.signal(signal.SIGTERM, _interrupt)
    runs: list[Run] = []
    hog_limit = args.runs * (args.run_timeout + 2 * STOP_GRACE_SECONDS) + 60
    try:
        with hog_beside(args.hog, hog_limit) as hog:
            for number in range(1, args.runs + 1):
                name = f"run-{number:0{width}d}"
                report = out / f"{name}.xml"
                command = pytest_command(args.suite, pytest_args, report)
                print(f"flakes: run {number}/{args.runs} ({out / name}.log) ...", flush=True)
                run = run_once(number, command, out / f"{name}.log", report, args.run_timeout, hog)
                runs.append(run)
                print(f"flakes: {run_line(run, args.runs)}", flush=True)
                if run.interrupted:
                    break
    except KeyboardInterrupt:  # between runs, or a second Ctrl-C
        pass
    print(summary(runs, args.runs))
    interrupted = len(runs) < args.runs or runs[-1].interrupted
    return 130 if interrupted else exit_code(runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
