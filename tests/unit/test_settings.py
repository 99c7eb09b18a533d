"""App settings read from the environment: numbers are checked, and a bad one is named."""

from __future__ import annotations

import pytest

from shared.contract import Setting
from shared.settings import ConfigurationError, Settings

LOCAL = {
    Setting.STORAGE: "UseDevelopmentStorage=true",
    Setting.SERVICE_BUS: "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v;",
}


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "Infinity"])
def test_a_number_that_is_not_finite_names_the_setting(raw: str) -> None:
    """float() reads these; a NaN passes every comparison, so it is refused by name
    rather than failing later inside timedelta."""
    with pytest.raises(
        ConfigurationError, match=f"setting StepTimeoutSeconds must be a finite number, got '{raw}'"
    ):
        Settings.from_env({**LOCAL, Setting.STEP_TIMEOUT_SECONDS: raw})
