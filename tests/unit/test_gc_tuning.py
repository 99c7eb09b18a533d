"""The worker's collector settings, checked in a fresh interpreter (they are global)."""

from __future__ import annotations

import json
import subprocess
import sys

from shared.gc_tuning import YOUNG_THRESHOLD

PROBE = """
import gc, json, weakref
gc.disable()  # only the tuning may collect
before = gc.get_threshold()
class Cycle:
    pass
garbage = Cycle(); garbage.me = garbage; watcher = weakref.ref(garbage); del garbage
from shared.gc_tuning import tune_for_long_lived_worker
tune_for_long_lived_worker()
frozen = gc.get_freeze_count()
tune_for_long_lived_worker()
leftover = watcher() is not None
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "again": gc.get_freeze_count(), "leftover": leftover}))
"""


def test_startup_objects_are_frozen_young_ones_collected_less_often_and_no_garbage_kept() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert seen["before"][0] == 700  # Python's default
    assert seen["after"] == [YOUNG_THRESHOLD, seen["before"][1], seen["before"][2]]
    assert seen["frozen"] > 1000  # the modules and objects imported so far
    assert seen["again"] == seen["frozen"]  # once per process
    # The unreachable cycle was collected before the freeze, not frozen with the rest.
    assert seen["leftover"] is False
