"""The deployment files hold together: what `bicep build`, `azd up` and `docker compose`
would reject first, checked without them (none can run here), plus the security baseline.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from shared.contract import ARCHIVE_CONTAINER, Setting
from tests.infra.bicep import BicepFile, Call, Interpolation, Ref, Value
from tests.infra.deployment import (
    EMULATOR_AMQP_PORT,
    INFRA,
    ROOT,
    bicep,
    bicep_paths,
    bound,
    deployed_app_settings,
    function_module,
    identity_output,
    load_json,
    load_yaml,
    main,
    module_file,
    only_resource,
    service_bus_emulator_port,
    walk_values,
)


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _local_calls() -> list[tuple[BicepFile, str]]:
    return [
        (bicep(path), symbol)
        for path in bicep_paths()
        for symbol, call in bicep(path).modules.items()
        if not call.is_registry
    ]


# ---------------------------------------------------------------------------
# Module wiring: what `bicep build` would reject
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "symbol"), _local_calls(), ids=lambda v: v if isinstance(v, str) else v.path.name
)
def test_local_module_calls_pass_exactly_the_declared_params(
    caller: BicepFile, symbol: str
) -> None:
    call = caller.modules[symbol]
    target = (caller.path.parent / call.source).resolve()
    assert target.is_file(), f"{caller.path.name}: module {call.source} does not exist"
    declared = module_file(caller, call).params
    unknown = sorted(set(call.params) - set(declared))
    missing = sorted(name for name, p in declared.items() if p.required and name not in call.params)
    assert not unknown, f"{symbol}: {call.source} has no params {unknown}"
    assert not missing, f"{symbol}: {call.source} needs {missing}"


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_module_outputs_read_are_declared(path: Path) -> None:
    file = bicep(path)
    for chain in file.member_paths:
        if len(chain) < 3 or chain[1] != "outputs" or chain[0] not in file.modules:
            continue
        call = file.modules[chain[0]]
        if call.is_registry:
            continue
        outputs = module_file(file, call).outputs
        assert chain[2] in outputs, f"{_relative(path)}: {call.source} has no output {chain[2]}"


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_registry_modules_are_pinned_azure_verified_modules(path: Path) -> None:
    for call in bicep(path).modules.values():
        if call.is_registry:
            assert re.fullmatch(
                r"br/public:avm/(res|ptn|utl)/[a-z0-9/-]+:\d+\.\d+\.\d+", call.source
            ), f"{call.symbol}: {call.source} is not a pinned AVM"


# Resource types whose only GA API version is too old for what we set (diagnosticSettings:
# 2016-09-01 has no category groups), with the preview current templates use.
PREVIEW_ONLY = {"Microsoft.Insights/diagnosticSettings": "2021-05-01-preview"}


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_resource_types_carry_ga_api_versions(path: Path) -> None:
    for resource in bicep(path).resources.values():
        assert re.fullmatch(r"Microsoft\.[A-Za-z]+(/[A-Za-z]+)+", resource.type), resource.type
        if resource.type in PREVIEW_ONLY:
            assert resource.api_version == PREVIEW_ONLY[resource.type], resource.symbol
            continue
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", resource.api_version), (
            f"{resource.symbol}: API version {resource.api_version!r} (a preview?)"
        )


# ---------------------------------------------------------------------------
# Secrets: none in outputs, none fetched, none written
# ---------------------------------------------------------------------------

SECRET_NAME = re.compile(r"key|secret|password|connectionstring|sas|token|credential", re.I)
SECRET_MEMBER = re.compile(
    r"connectionstring|instrumentationkey|primarykey|secondarykey|accountkey|sharedaccesskey", re.I
)
SECRET_TEXT = re.compile(r"AccountKey=|SharedAccessKey=|SharedAccessSignature|sig=", re.I)


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_no_output_looks_like_a_secret(path: Path) -> None:
    for output in bicep(path).outputs.values():
        assert not SECRET_NAME.search(output.name), f"output {output.name}: a secret's name"
        assert "secure" not in output.decorators, f"output {output.name} is @secure()"
        for value in walk_values(output.value):
            if isinstance(value, Ref):
                assert not any(SECRET_MEMBER.search(m) for m in value.path), (
                    f"output {output.name} reads {value}"
                )
            if isinstance(value, Call):
                assert not value.function.split(".")[-1].startswith("list"), (
                    f"output {output.name} calls {value.function}"
                )


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_no_keys_are_fetched_or_written(path: Path) -> None:
    file = bicep(path)
    listing = sorted(f for f in file.functions if f.split(".")[-1].startswith("list"))
    assert not listing, f"{_relative(path)} fetches keys: {listing} (use identities)"
    source = path.read_text(encoding="utf-8")
    assert not SECRET_TEXT.search(source), f"{_relative(path)} holds key material"


def test_app_settings_hold_no_key_material() -> None:
    for key, value in deployed_app_settings().items():
        for part in walk_values(value):
            if isinstance(part, str):
                assert not SECRET_TEXT.search(part), f"app setting {key} holds a key"
            if isinstance(part, Ref) and key != "APPLICATIONINSIGHTS_CONNECTION_STRING":
                assert not any(SECRET_MEMBER.search(m) for m in part.path), f"{key} reads {part}"


def test_parameters_file_holds_no_literal_values() -> None:
    parameters = load_json(INFRA / "main.parameters.json")["parameters"]
    for name, entry in parameters.items():
        assert re.fullmatch(r"\$\{[A-Z][A-Z0-9_]*\}", entry["value"]), (
            f"{name}: take it from the azd environment, not a literal"
        )


# ---------------------------------------------------------------------------
# main.bicep and main.parameters.json: the azd conventions
# ---------------------------------------------------------------------------


def test_main_creates_the_resource_group_azd_expects() -> None:
    file = main()
    assert file.target_scope == "subscription"
    rg = only_resource(file, "Microsoft.Resources/resourceGroups")
    assert isinstance(rg.name, Interpolation) and rg.name.parts[-1] == Ref(("environmentName",))
    assert file.resolve(rg.name.parts[0]) == "rg-"
    assert file.resolve(Ref(("tags",))) == {"azd-env-name": Ref(("environmentName",))}
    assert file.params["location"].decorators["metadata"] == ({"azd": {"type": "location"}},)


# Names of child resources (a container, a table): not prefixed, scoped by their parent.
CHILD_RESOURCE_NAMES = {"deploymentContainerName", "stateTableName"}


def test_names_are_unique_strings_with_standard_prefixes() -> None:
    file = main()
    token = file.variables["resourceToken"].value
    assert isinstance(token, Call) and token.function == "toLower"
    assert isinstance(token.args[0], Call) and token.args[0].function == "uniqueString"
    abbreviations = set(load_json(INFRA / "abbreviations.json").values())
    names = [
        (f"{call.symbol}.{key}", file.resolve(value, defaults=False))
        for call in file.modules.values()
        for key, value in call.params.items()
        if (key == "name" or key.endswith("Name")) and key not in CHILD_RESOURCE_NAMES
    ]
    generated = [(where, name) for where, name in names if isinstance(name, Interpolation)]
    assert len(generated) >= 7, "identity, plan, app, storage, namespace, workspace, component"
    for where, name in generated:
        assert isinstance(name, Interpolation)
        assert file.resolve(name.parts[0]) in abbreviations, f"{where}: no standard prefix"
        assert Ref(("resourceToken",)) in name.parts, f"{where}: not unique per environment"


def test_parameters_file_maps_azd_variables_to_main_params() -> None:
    parameters = load_json(INFRA / "main.parameters.json")["parameters"]
    params = main().params
    assert set(parameters) <= set(params), f"unknown: {set(parameters) - set(params)}"
    required = {name for name, p in params.items() if p.required}
    assert required <= set(parameters), f"azd would prompt for {required - set(parameters)}"
    assert parameters["environmentName"]["value"] == "${AZURE_ENV_NAME}"
    assert parameters["location"]["value"] == "${AZURE_LOCATION}"
    assert parameters["principalId"]["value"] == "${AZURE_PRINCIPAL_ID}"


@pytest.mark.parametrize(
    "output",
    [
        "AZURE_RESOURCE_GROUP",
        "AZURE_FUNCTION_APP_NAME",
        "SERVICE_API_URI",
        "SERVICE_BUS_FULLY_QUALIFIED_NAMESPACE",
        "AZURE_STORAGE_ACCOUNT_NAME",
    ],
)
def test_main_outputs_what_azd_and_the_docs_use(output: str) -> None:
    assert output in main().outputs


# ---------------------------------------------------------------------------
# Flex Consumption, storage and Service Bus baselines
# ---------------------------------------------------------------------------

# App settings Flex Consumption rejects or ignores (it owns runtime and package).
FLEX_REJECTED = {
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "SCM_DO_BUILD_DURING_DEPLOYMENT",
    "ENABLE_ORYX_BUILD",
}


def _at(value: Value, *keys: str) -> Value:
    """``value[k1][k2]...`` through nested objects, failing with the path that is missing."""
    for key in keys:
        assert isinstance(value, dict) and key in value, f"no {key!r} in {value!r}"
        value = value[key]
    return value


def _python_version() -> str:
    """The newest Python the project supports (`>=3.11,<3.13`: 3.12), which Azure runs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    match = re.fullmatch(r">=\s*3\.\d+\s*,\s*<\s*3\.(\d+)", project["project"]["requires-python"])
    assert match is not None, "requires-python names its lowest and first unsupported version"
    return f"3.{int(match[1]) - 1}"


def test_function_app_runs_on_flex_consumption_as_its_identity() -> None:
    api = function_module()
    plan = only_resource(api.file, "Microsoft.Web/serverfarms")
    assert plan.body["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert plan.properties["reserved"] is True, "Flex Consumption is Linux"
    site = only_resource(api.file, "Microsoft.Web/sites")
    assert site.body["kind"] == "functionapp,linux"
    identity = site.body["identity"]
    assert isinstance(identity, dict) and identity["type"] == "UserAssigned"
    config = site.properties["functionAppConfig"]
    assert _at(config, "runtime") == {"name": "python", "version": _python_version()}
    storage = api.evaluate(_at(config, "deployment", "storage"))
    assert _at(storage, "type") == "blobContainer"
    assert _at(storage, "authentication") == {
        "type": "UserAssignedIdentity",
        "userAssignedIdentityResourceId": identity_output("resourceId"),
    }
    # Scale limits are main.bicep parameters, passed through unchanged.
    scale = _at(config, "scaleAndConcurrency")
    for setting in ("instanceMemoryMB", "maximumInstanceCount"):
        assert _at(scale, setting) == Ref((setting,))
        assert api.call.params[setting] == Ref((setting,)) and setting in main().params
    assert site.properties["httpsOnly"] is True


def test_deployment_container_is_the_one_storage_creates() -> None:
    api, storage = function_module(), bound("app/storage.bicep")
    assert api.call.params["deploymentContainerName"] == Ref(("deploymentContainerName",))
    assert storage.call.params["deploymentContainerName"] == Ref(("deploymentContainerName",))
    containers = {
        r.symbol: r.name
        for r in storage.file.resources_of_type(
            "Microsoft.Storage/storageAccounts/blobServices/containers"
        )
        if not r.existing
    }
    assert containers == {
        "deploymentContainer": Ref(("deploymentContainerName",)),
        "archiveContainer": Ref(("archiveContainerName",)),
    }


def test_the_archive_container_is_the_one_the_code_writes_to() -> None:
    storage = bound("app/storage.bicep")
    assert storage.call.params["archiveContainerName"] == Ref(("archiveContainerName",))
    assert main().variables["archiveContainerName"].value == ARCHIVE_CONTAINER


def test_app_settings_leave_out_what_flex_consumption_rejects() -> None:
    rejected = sorted(FLEX_REJECTED & set(deployed_app_settings()))
    assert not rejected, f"Flex Consumption rejects {rejected}"


def test_azd_finds_the_function_app_by_its_service_tag() -> None:
    services = load_yaml(ROOT / "azure.yaml")["services"]
    site = only_resource(function_module().file, "Microsoft.Web/sites")
    tags = site.body["tags"]
    assert isinstance(tags, Call) and tags.function == "union"
    assert {"azd-service-name": next(iter(services))} in tags.args


def test_storage_account_allows_no_keys_and_no_public_blobs() -> None:
    storage = bound("app/storage.bicep")
    account = only_resource(storage.file, "Microsoft.Storage/storageAccounts")
    properties = account.properties
    assert properties["allowSharedKeyAccess"] is False
    assert properties["minimumTlsVersion"] == "TLS1_2"
    assert properties["allowBlobPublicAccess"] is False
    assert properties["supportsHttpsTrafficOnly"] is True


def test_the_state_table_is_created_with_the_deployed_name() -> None:
    storage = bound("app/storage.bicep")
    table = only_resource(storage.file, "Microsoft.Storage/storageAccounts/tableServices/tables")
    assert storage.evaluate(table.name) == deployed_app_settings()[Setting.STATE_TABLE]


def test_service_bus_allows_no_sas_and_offers_tiers_with_duplicate_detection() -> None:
    servicebus = bound("app/servicebus.bicep")
    namespace = only_resource(servicebus.file, "Microsoft.ServiceBus/namespaces")
    assert namespace.properties["disableLocalAuth"] is True
    assert namespace.properties["minimumTlsVersion"] == "1.2"
    for file in (main(), servicebus.file):
        sku = file.params["serviceBusSku" if file is main() else "sku"]
        assert sku.allowed == ["Standard", "Premium"], "Basic has no duplicate detection"
        assert sku.default == "Standard"


# ---------------------------------------------------------------------------
# azure.yaml
# ---------------------------------------------------------------------------


def test_azure_yaml_deploys_the_app_root_as_one_python_function() -> None:
    config = load_yaml(ROOT / "azure.yaml")
    assert config["name"]
    assert config["services"] == {"api": {"project": ".", "language": "python", "host": "function"}}
    infra = config.get("infra", {})
    path = ROOT / infra.get("path", "infra") / f"{infra.get('module', 'main')}.bicep"
    assert path == INFRA / "main.bicep" and path.is_file()
    assert (ROOT / "function_app.py").is_file() and (ROOT / "requirements.txt").is_file()


# ---------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------


def _compose() -> dict[str, dict[str, object]]:
    services: dict[str, dict[str, object]] = load_yaml(ROOT / "docker-compose.yml")["services"]
    return services


def _service(image_prefix: str) -> dict[str, object]:
    found = [s for s in _compose().values() if str(s.get("image", "")).startswith(image_prefix)]
    assert len(found) == 1, f"docker-compose.yml: expected one {image_prefix} service"
    return found[0]


def _published(service: dict[str, object]) -> set[int]:
    ports = service.get("ports", [])
    assert isinstance(ports, list)
    return {int(str(p).split(":")[-2]) for p in ports}


def test_compose_runs_the_service_bus_emulator_with_the_repo_config() -> None:
    emulator = _service("mcr.microsoft.com/azure-messaging/servicebus-emulator")
    volumes = emulator.get("volumes")
    assert isinstance(volumes, list)
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in volumes}
    config = mounts.get("/ServiceBus_Emulator/ConfigFiles/Config.json")
    assert config == "./emulator/servicebus-config.json" and (ROOT / config).is_file()
    assert service_bus_emulator_port() == EMULATOR_AMQP_PORT
    assert EMULATOR_AMQP_PORT in _published(emulator), "local.settings' AMQP port is published"
    environment = emulator.get("environment")
    assert isinstance(environment, dict)
    assert environment["SQL_SERVER"] in _compose(), "SQL_SERVER names the SQL service"
    assert str(environment["ACCEPT_EULA"]).startswith("${ACCEPT_EULA:?"), "EULA is explicit"
    sql = _compose()[str(environment["SQL_SERVER"])]
    sql_environment = sql.get("environment")
    assert isinstance(sql_environment, dict)
    assert sql_environment["MSSQL_SA_PASSWORD"] == environment["MSSQL_SA_PASSWORD"]
    assert not sql.get("ports"), "SQL Server stays inside the compose network"


def test_compose_runs_the_same_azurite_as_npm_on_the_default_ports() -> None:
    azurite = _service("mcr.microsoft.com/azure-storage/azurite")
    version = load_json(ROOT / "package.json")["devDependencies"]["azurite"]
    assert azurite["image"] == f"mcr.microsoft.com/azure-storage/azurite:{version}"
    # UseDevelopmentStorage=true means the default ports.
    assert {10000, 10001, 10002} <= _published(azurite)


# ---------------------------------------------------------------------------
# docs/: the configuration table covers every setting and parameter
# ---------------------------------------------------------------------------


def test_configuration_doc_lists_every_setting_and_parameter() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    settings = {v for k, v in vars(Setting).items() if k.isupper() and isinstance(v, str)}
    missing = sorted(s for s in settings | set(deployed_app_settings()) if f"`{s}`" not in doc)
    assert not missing, f"docs/configuration.md does not describe {missing}"
    params = sorted(p for p in main().params if f"`{p}`" not in doc)
    assert not params, f"docs/configuration.md does not describe the parameters {params}"
    variables = load_json(INFRA / "main.parameters.json")["parameters"]
    for name, entry in variables.items():
        variable = entry["value"].strip("${}")
        assert f"`{variable}`" in doc, f"docs/configuration.md: {name}'s variable {variable}"
