// Scheduler-Agent-Supervisor order processing: everything `azd up` creates.
//
// One resource group holding a Flex Consumption Function App (Python 3.12) with a
// user-assigned managed identity, its storage account (host, deployment package and the
// state table), a Service Bus namespace with the contract queues, and Log Analytics +
// Application Insights. No keys, connection strings or SAS anywhere: every connection is
// identity-based and every grant is a data-plane role (app/rbac.bicep).
//
// tests/infra checks this folder against the code (shared/contract.py, shared/settings.py):
// queue names and properties, the app settings the code reads, the roles it needs.
targetScope = 'subscription'

// ---------------------------------------------------------------------------
// azd environment
// ---------------------------------------------------------------------------

@minLength(1)
@maxLength(64)
@description('Name of the azd environment (AZURE_ENV_NAME): names the resource group and seeds the unique resource names.')
param environmentName string

@minLength(1)
@description('Region of every resource. It must offer the Flex Consumption plan: az functionapp list-flexconsumption-locations.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Object id of the deploying user (AZURE_PRINCIPAL_ID). When set, that principal gets the same data-plane roles as the app (tables, blobs, send and receive) to debug against Azure. Leave empty in CI and production.')
param principalId string = ''

@description('Kind of principal principalId names.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param principalType string = 'User'

// ---------------------------------------------------------------------------
// Hosting
// ---------------------------------------------------------------------------

@description('Memory of each Flex Consumption instance, in MB. CPU and network scale with it.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Upper bound on Flex Consumption instances: a cost ceiling. The platform accepts 40 to 1000.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

// ---------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------

@description('OTEL_TRACES_SAMPLER: the sampler of the Azure Monitor OpenTelemetry distro, in its own spelling (parentbased_trace_id_ratio, not the SDK\'s parentbased_traceidratio, which the distro does not know and replaces with 5 traces/s). Parent-based (or all), so that once a failed span or the Supervisor\'s recovery keeps an order\'s trace, its later hops are kept too.')
@allowed([
  'parentbased_trace_id_ratio'
  'parentbased_always_on'
  'always_on'
])
param tracesSampler string = 'parentbased_trace_id_ratio'

@description('OTEL_TRACES_SAMPLER_ARG: the share of orders whose trace is kept (0 to 1) for parentbased_trace_id_ratio. Failed spans and recovered orders are kept whatever it says.')
param tracesSamplerArg string = '0.1'

// ---------------------------------------------------------------------------
// Alerts and diagnostics (app/alerts.bicep, app/diagnostics.bicep)
// ---------------------------------------------------------------------------

@description('Email address notified of every alert: an operator alert raised, dead letters on a queue, orders held in Error, the Supervisor not running (docs/operations.md#alerts).')
@minLength(3)
param alertEmail string

@description('Resource ids of existing action groups (an on-call rotation, a chat channel) also notified of every alert, as a JSON list. Empty: the email alone.')
param alertActionGroupIds array = []

@description('How long without a Supervisor sweep before the "Supervisor not running" alert fires.')
@allowed([
  'PT10M'
  'PT15M'
  'PT30M'
  'PT1H'
])
param supervisorSilence string = 'PT15M'

@description('Also send every storage read to Log Analytics (diagnostic settings). Reads are most of the account\'s requests, so off by default; writes and deletes always go.')
param storageReadLogs bool = false

// ---------------------------------------------------------------------------
// Service Bus
// ---------------------------------------------------------------------------

@description('Service Bus tier. Standard is the cheapest tier with duplicate detection, which the app relies on (Basic has none); Premium adds isolation, VNet integration and larger messages.')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('Messaging units when serviceBusSku is Premium; ignored for Standard.')
@allowed([
  1
  2
  4
  8
  16
])
param serviceBusPremiumCapacity int = 1

@description('Time-to-live of a status notification on order-status (ISO 8601 duration), after which an unread one is dropped. The submitting application reads them; GET /api/orders/{orderId} answers the same at any time.')
param orderStatusTimeToLive string = 'P1D'

@description('Time-to-live of an operator alert on operator-alerts (ISO 8601 duration), after which an unread one is dropped. Each alert has raised an Azure Monitor alert when it arrived, and its order stays in the state table (cli failures).')
param operatorAlertsTimeToLive string = 'P7D'

@description('Also grant the app identity Azure Service Bus Data Owner. Only the scale controller benefits: with the Manage right it reads exact queue lengths; with Sender + Receiver alone it falls back to a coarser signal and logs unauthorized warnings. The code itself never needs it.')
param serviceBusOwnerForScaling bool = false

// ---------------------------------------------------------------------------
// App settings read by the code (shared/settings.py, shared/contract.py Setting)
// ---------------------------------------------------------------------------

@description('StateTableName: the table holding orders and their process state. Created here.')
@minLength(3)
@maxLength(63)
param stateTableName string = 'Orders'

@description('SupervisorSchedule: NCRONTAB (six fields, seconds first) of the Supervisor timer. Each run is a billed execution; see docs/deploy.md for the cost of the schedule.')
param supervisorSchedule string = '*/30 * * * * *'

@description('ReconcileSchedule: NCRONTAB of the reconciliation timer, which checks a sample of recently finished orders, and of orders held in Error or Suspended, against the services\' keys (hourly: 24 billed runs a day).')
param reconcileSchedule string = '0 0 * * * *'

@description('ReconcileSampleSize: orders (finished, or held in Error or Suspended) one reconciliation run checks at most.')
@minValue(1)
@maxValue(1000)
param reconcileSampleSize int = 50

@description('ArchiveSchedule: NCRONTAB of the archive timer, which moves finished orders past their retention to the order-archive container and deletes their rows (hourly: 24 billed runs a day; each paced and bounded).')
param archiveSchedule string = '0 30 * * * *'

@description('RetentionProcessedDays: days a Processed order stays in the state table before it is archived; 0 keeps it forever.')
@minValue(0)
param retentionProcessedDays int = 30

@description('RetentionCancelledDays: the same for a Cancelled order.')
@minValue(0)
param retentionCancelledDays int = 90

@description('RetentionCompensatedDays: the same for a Compensated order (Error and orders in flight are never archived).')
@minValue(0)
param retentionCompensatedDays int = 90

@description('StepTimeoutSeconds: complete-by of a step whose workflow sets no timeout of its own.')
@minValue(1)
param stepTimeoutSeconds int = 30

@description('PendingTimeoutSeconds: how long an order may stay Pending before the Supervisor nudges the Scheduler again.')
@minValue(1)
param pendingTimeoutSeconds int = 60

@description('MaxFailureCount: expired attempts of an order before it is exhausted.')
@minValue(1)
param maxFailureCount int = 3

@description('ExhaustedPolicy: what happens to an order at MaxFailureCount (hold for an operator, or compensate).')
@allowed([
  'hold'
  'compensate'
])
param exhaustedPolicy string = 'hold'

@description('ReplyToAllowList: comma-separated queues a client may name as replyTo.')
param replyToAllowList string = 'order-status'

@description('Base URL of each agent\'s remote service, keyed by the agent\'s serviceUrlSetting in catalogue.json, e.g. {"InventoryServiceUrl": "https://inventory.example.com", ...}. Every agent of the catalogue needs one (there is no simulator in Azure): a missing key fails the deployment naming it; keys of no agent are ignored.')
param serviceUrls object

@description('Fleet-wide limits that override catalogue.json, as app settings: a list of {name, value}, each name AgentLimits__{agent}__callsPerSecond or AgentLimits__{agent}__maxConcurrent (value 0 lifts the catalogue\'s limit), e.g. [{"name": "AgentLimits__payment__callsPerSecond", "value": "5"}]. Empty: the catalogue\'s limits.')
param agentLimitSettings array = []

@description('StepHeartbeatSeconds: how far one step heartbeat of a long call moves its step\'s complete-by.')
@minValue(1)
param stepHeartbeatSeconds int = 10

@description('StepMaxSeconds: how long from its dispatch step heartbeats may keep a step running; 0 turns them off.')
@minValue(0)
param stepMaxSeconds int = 0

@description('ClockSkewSeconds: how long after its complete-by a request may still apply at its provider (network delay plus clock disagreement); no undo or move of its step goes before then unless its key settles.')
@minValue(0)
param clockSkewSeconds int = 5

@description('IntakeMaxPendingPerCustomer: orders not terminal one customer may have before the intake answers 429; 0: no limit.')
@minValue(0)
param intakeMaxPendingPerCustomer int = 0

@description('FairShareRunningPerCustomer: orders of one customer running at once while more of its orders wait; 0: off (fairness is opt-in: a customer with a backlog then delays the others; docs/fairness.md).')
@minValue(0)
param fairShareRunningPerCustomer int = 0

@description('HighPriorityStepTimeoutSeconds: the tighter complete-by of a high-priority order\'s steps.')
@minValue(1)
param highPriorityStepTimeoutSeconds int = 15

@description('BulkActionsPerSecond: how fast a bulk job (POST /api/orders/bulk) acts on orders.')
@minValue(1)
param bulkActionsPerSecond int = 50

@description('OperatorAuth (docs/sign-in.md): empty, operators use the master key only, as before; token, an Entra bearer token validated in the app (for Flex Consumption, whose docs list built-in authentication as not supported); platform, App Service authentication (authsettingsV2) on a plan that supports it. token and platform need operatorAuthClientId.')
@allowed([
  ''
  'token'
  'platform'
])
param operatorAuth string = ''

@description('Client id of the app registration operators sign in to, with the app roles Orders.Read and Orders.Operate (docs/sign-in.md); used with operatorAuth token or platform.')
param operatorAuthClientId string = ''

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

var abbrs = loadJsonContent('abbreviations.json')
var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = '${abbrs.webSitesFunctions}${resourceToken}'
// The order archive's container: the name the code uses (shared/contract.py ARCHIVE_CONTAINER).
var archiveContainerName = 'order-archive'
var deploymentContainerName = 'app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}'

// The agents and workflows (catalogue.json, shared/catalogue): each agent brings its two
// queues and its service URL setting, so adding an agent is one edit there.
var catalogue = loadJsonContent('../catalogue.json')

// The contract queues (shared/contract.py ALL_QUEUES): the core queues the app consumes
// (CORE_QUEUES but the notification queues), then each catalogue agent's queue and its
// high-priority lane.
var coreQueueNames = [
  'orders'
  'scheduler'
  'agent-replies'
  'scheduler-high'
  'agent-replies-high'
]
// A for-expression rather than map(): checkov's Bicep parser reads no lambdas.
var agentQueueNames = [for agent in catalogue.agents: ['agent-${agent.name}', 'agent-${agent.name}-high']]
var queueNames = concat(coreQueueNames, flatten(agentQueueNames))
// The queues the app only writes (NOTIFICATION_QUEUES), with their messages' time-to-live.
var notificationQueues = [
  { name: 'order-status', timeToLive: orderStatusTimeToLive }
  { name: 'operator-alerts', timeToLive: operatorAlertsTimeToLive }
]

// One app setting per catalogue agent: its serviceUrlSetting = serviceUrls[that name].
var serviceUrlSettings = [
  for agent in catalogue.agents: {
    name: agent.serviceUrlSetting
    value: serviceUrls[agent.serviceUrlSetting]
  }
]

// ---------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------

resource rg 'Microsoft.Resources/resourceGroups@2021-04-01' = {
  name: '${abbrs.resourcesResourceGroups}${environmentName}'
  location: location
  tags: tags
}

// Azure Verified Module: an identity has nothing to configure, so the AVM hides nothing.
module identity 'br/public:avm/res/managed-identity/user-assigned-identity:0.4.1' = {
  name: 'identity'
  scope: rg
  params: {
    name: '${abbrs.managedIdentityUserAssignedIdentities}${resourceToken}'
    location: location
    tags: tags
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: '${abbrs.operationalInsightsWorkspaces}${resourceToken}'
    applicationInsightsName: '${abbrs.insightsComponents}${resourceToken}'
    location: location
    tags: tags
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: '${abbrs.storageStorageAccounts}${resourceToken}'
    location: location
    tags: tags
    deploymentContainerName: deploymentContainerName
    stateTableName: stateTableName
    archiveContainerName: archiveContainerName
  }
}

module serviceBus 'app/servicebus.bicep' = {
  name: 'serviceBus'
  scope: rg
  params: {
    name: '${abbrs.serviceBusNamespaces}${resourceToken}'
    location: location
    tags: tags
    sku: serviceBusSku
    premiumCapacity: serviceBusPremiumCapacity
    queueNames: queueNames
    notificationQueues: notificationQueues
  }
}

module api 'app/function.bicep' = {
  name: 'api'
  scope: rg
  params: {
    name: functionAppName
    planName: '${abbrs.webServerFarms}${resourceToken}'
    location: location
    tags: tags
    identityId: identity.outputs.resourceId
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: deploymentContainerName
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    instanceMemoryMB: instanceMemoryMB
    maximumInstanceCount: maximumInstanceCount
    stateTableName: stateTableName
    supervisorSchedule: supervisorSchedule
    reconcileSchedule: reconcileSchedule
    reconcileSampleSize: reconcileSampleSize
    archiveSchedule: archiveSchedule
    retentionProcessedDays: retentionProcessedDays
    retentionCancelledDays: retentionCancelledDays
    retentionCompensatedDays: retentionCompensatedDays
    stepTimeoutSeconds: stepTimeoutSeconds
    pendingTimeoutSeconds: pendingTimeoutSeconds
    maxFailureCount: maxFailureCount
    exhaustedPolicy: exhaustedPolicy
    replyToAllowList: replyToAllowList
    serviceUrlSettings: serviceUrlSettings
    agentLimitSettings: agentLimitSettings
    highPriorityStepTimeoutSeconds: highPriorityStepTimeoutSeconds
    stepHeartbeatSeconds: stepHeartbeatSeconds
    stepMaxSeconds: stepMaxSeconds
    clockSkewSeconds: clockSkewSeconds
    intakeMaxPendingPerCustomer: intakeMaxPendingPerCustomer
    fairShareRunningPerCustomer: fairShareRunningPerCustomer
    bulkActionsPerSecond: bulkActionsPerSecond
    tracesSampler: tracesSampler
    tracesSamplerArg: tracesSamplerArg
    operatorAuth: operatorAuth
    operatorAuthClientId: operatorAuthClientId
  }
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    appPrincipalId: identity.outputs.principalId
    archiveContainerName: storage.outputs.archiveContainerName
    serviceBusOwnerForScaling: serviceBusOwnerForScaling
    principalId: principalId
    principalType: principalType
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    actionGroupName: '${abbrs.insightsActionGroups}${resourceToken}'
    location: location
    tags: tags
    alertEmail: alertEmail
    extraActionGroupIds: alertActionGroupIds
    serviceBusNamespaceName: serviceBus.outputs.name
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsId
    supervisorSilence: supervisorSilence
  }
}

module diagnostics 'app/diagnostics.bicep' = {
  name: 'diagnostics'
  scope: rg
  params: {
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsId
    functionAppName: api.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
    storageAccountName: storage.outputs.name
    storageReadLogs: storageReadLogs
  }
}

// ---------------------------------------------------------------------------
// Outputs: written by azd to .azure/<env>/.env; names and endpoints only, never secrets.
// ---------------------------------------------------------------------------

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = api.outputs.name
output SERVICE_API_NAME string = api.outputs.name
output SERVICE_API_URI string = api.outputs.uri
output AZURE_USER_ASSIGNED_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output SERVICE_BUS_NAMESPACE string = serviceBus.outputs.name
output SERVICE_BUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output AZURE_STORAGE_TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output STATE_TABLE_NAME string = stateTableName
output OPERATOR_AUTH string = operatorAuth
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.applicationInsightsName
