// Diagnostic settings: the platform's own logs and metrics of the Function App, the
// Service Bus namespace and the storage account, sent to the Log Analytics workspace that
// already holds the app's telemetry, so one workspace answers for an incident
// (docs/operations.md#alerts). Costs: docs/deploy.md.

@description('Log Analytics workspace receiving everything.')
param logAnalyticsWorkspaceId string

@description('The Function App.')
param functionAppName string

@description('The Service Bus namespace.')
param serviceBusNamespaceName string

@description('The storage account (host, deployment package, state table, archive).')
param storageAccountName string

@description('Also log every storage read: by far the largest share of the account\'s requests (every state-table read), so off by default; writes and deletes are always logged.')
param storageReadLogs bool = false

var settingName = 'to-log-analytics'
var allMetrics = [
  {
    category: 'AllMetrics'
    enabled: true
  }
]
var storageMetrics = [
  {
    category: 'Transaction'
    enabled: true
  }
]
var storageLogs = [
  {
    category: 'StorageRead'
    enabled: storageReadLogs
  }
  {
    category: 'StorageWrite'
    enabled: true
  }
  {
    category: 'StorageDelete'
    enabled: true
  }
]

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

// FunctionAppLogs: the host's and the functions' logs, per invocation.
resource functionAppDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: functionApp
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: allMetrics
  }
}

// Operational logs (entity changes), plus the runtime audit logs on Premium.
resource serviceBusDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: namespace
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: allMetrics
  }
}

// The account carries only metrics; each service (blob, table) carries its own logs.
resource storageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: storage
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    metrics: storageMetrics
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: blobService
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: storageLogs
    metrics: storageMetrics
  }
}

resource tableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: tableService
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: storageLogs
    metrics: storageMetrics
  }
}
