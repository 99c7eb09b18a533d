"""The catalogue file's shape, checked field by field before any rule is."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
NAME_MAX_LENGTH = 40
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]
"""Lower-case words joined by hyphens: it becomes a queue name, a function name and a
URL segment, so nothing else is allowed."""
SettingName = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=64)]
Input = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]*\.[A-Za-z][A-Za-z0-9_]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    comment: str | None = Field(default=None, alias="$comment")


class RetryModel(_Strict):
    initial_backoff_seconds: float = Field(default=0.2, alias="initialBackoffSeconds", gt=0)
    max_backoff_seconds: float = Field(default=5.0, alias="maxBackoffSeconds", gt=0)
    call_timeout_seconds: float = Field(default=10.0, alias="callTimeoutSeconds", gt=0)


class AgentModel(_Strict):
    name: Name
    service_url_setting: SettingName = Field(alias="serviceUrlSetting")
    local_service_url: str = Field(default="", alias="localServiceUrl")
    capacity: int = Field(default=16, ge=1, le=1000)
    outcome_queries: bool = Field(default=True, alias="outcomeQueries")
    abandon: bool = True
    alternatives: list[Name] = Field(default_factory=list)
    retry_elsewhere: bool = Field(default=False, alias="retryElsewhere")
    retry: RetryModel = Field(default_factory=RetryModel)
    max_concurrent: int | None = Field(default=None, alias="maxConcurrent", ge=1, le=1000)
    calls_per_second: float | None = Field(default=None, alias="callsPerSecond", gt=0, le=10000)


class StepModel(_Strict):
    name: Name
    agent: Name | None = None
    kind: str = "compensatable"
    undo: Name | None = None
    inputs: list[Input] = Field(default_factory=list)
    results: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )
    timeout_seconds: float | None = Field(default=None, alias="timeoutSeconds", gt=0)
    event: Name | None = None
    approval: bool = False
    on_deadline: str | None = Field(default=None, alias="onDeadline")
    final_deadline_seconds: float | None = Field(default=None, alias="finalDeadlineSeconds", gt=0)
    until: str | None = None
    wait_seconds: float | None = Field(default=None, alias="waitSeconds", gt=0)


class WorkflowModel(_Strict):
    name: Name
    version: int = Field(ge=1)
    default: bool = False
    steps: list[StepModel] = Field(min_length=1)


class CatalogueModel(_Strict):
    schema_: str | None = Field(default=None, alias="$schema")
    agents: list[AgentModel] = Field(min_length=1)
    workflows: list[WorkflowModel] = Field(min_length=1)
