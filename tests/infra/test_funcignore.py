"""The deployed package is the repo minus `.funcignore`: nothing the Function App imports
may be left out of it (an ignored module would only fail in Azure, at first import)."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys

from tests.infra.deployment import ROOT

_LOADED = """
import json, sys
import function_app
print(json.dumps([m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)]))
"""


def ignored(relative: str, patterns: list[str]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(part, pattern)
        for pattern in patterns
        for prefix, part in zip(prefixes, parts, strict=True)
    )


def test_nothing_the_function_app_imports_is_left_out_of_the_package() -> None:
    patterns = [
        line.strip().rstrip("/")
        for line in (ROOT / ".funcignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    loaded = subprocess.run(
        [sys.executable, "-c", _LOADED], cwd=ROOT, capture_output=True, text=True, check=True
    )
    files = [f for f in json.loads(loaded.stdout.splitlines()[-1]) if f.startswith(str(ROOT))]
    ours = [str(p.relative_to(ROOT)) for p in map(ROOT.joinpath, files) if ".venv" not in p.parts]
    assert "function_app.py" in ours
    assert any(f.startswith("shared/functions/") for f in ours)
    assert not [f for f in ours if ignored(f, patterns)]


def test_the_operator_cli_stays_out_of_the_package() -> None:
    """It runs on an operator's machine; docs/cli.md says why."""
    patterns = (ROOT / ".funcignore").read_text(encoding="utf-8").split()
    assert ignored("shared/cli/__main__.py", patterns)


def test_the_catalogue_ships_and_the_test_tools_do_not() -> None:
    """The app registers its triggers from catalogue.json at import: without it in the
    package, indexing would fail in Azure only. Chaos and the docs are not the app."""
    patterns = (ROOT / ".funcignore").read_text(encoding="utf-8").split()
    assert not ignored("catalogue.json", patterns)
    assert ignored("chaos/run.py", patterns)
    assert ignored("docs/contract.md", patterns)
