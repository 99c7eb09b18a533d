// Data-plane role assignments: exactly what the code and the Functions host do, nothing else.
//
// App identity
// - Storage Blob Data Owner on the account: the host's leases, timer schedule monitor and
//   keys (azure-webjobs-* containers) and Flex Consumption reading the deployment package.
// - Storage Table Data Contributor on the account: the state store (entities, and
//   create_table on first use).
// - Storage Blob Data Contributor on the order-archive container: the archiver writes
//   and reads its pages there (shared/adapters/blob_archive.py). The account-wide Blob Data
//   Owner above covers it today; this grant states the archive's own need, so narrowing
//   the host's role later does not break the archive.
// - No Storage Queue role: nothing uses storage queues (no queue or blob trigger, no
//   Durable Functions); add Storage Queue Data Contributor if that changes.
// - Azure Service Bus Data Sender + Data Receiver on the namespace: the code sends to every
//   queue, the triggers receive from all but order-status and operator-alerts (orders, the
//   Scheduler's and agent-replies' lanes, two per catalogue agent: 15 of 17 today).
//   Data Owner only with serviceBusOwnerForScaling.
// - Monitoring Metrics Publisher on Application Insights: Entra ID telemetry ingestion.
//
// Deploying principal (principalId, optional): the same storage and Service Bus roles, to
// run the app or the tests on a workstation against the deployed resources.
//
// Names are guid(scope, principal, role): stable across deployments, unique per grant.

@description('Storage account of the host, the deployment package and the state table.')
param storageAccountName string

@description('Blob container of archived orders.')
param archiveContainerName string

@description('Service Bus namespace holding the contract queues.')
param serviceBusNamespaceName string

@description('Application Insights component the app reports to.')
param applicationInsightsName string

@description('Principal (object) id of the app\'s user-assigned identity.')
param appPrincipalId string

@description('Also grant the app Azure Service Bus Data Owner, for exact scale metrics.')
param serviceBusOwnerForScaling bool = false

@description('Optional deploying principal to grant the same data access; empty for none.')
param principalId string = ''

@description('Kind of principal principalId names.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param principalType string = 'User'

// Built-in role definition ids (the same in every tenant).
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataOwner: '090c5cfd-751d-490a-894a-3ce6f1109419'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}

var grantDeployer = !empty(principalId)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: archiveContainerName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// ---------------------------------------------------------------------------
// App identity
// ---------------------------------------------------------------------------

resource appBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appArchiveBlobDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(archiveContainer.id, appPrincipalId, roles.storageBlobDataContributor)
  scope: archiveContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appServiceBusSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(serviceBus.id, appPrincipalId, roles.serviceBusDataSender)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appServiceBusReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(serviceBus.id, appPrincipalId, roles.serviceBusDataReceiver)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appServiceBusOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (serviceBusOwnerForScaling) {
  name: guid(serviceBus.id, appPrincipalId, roles.serviceBusDataOwner)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, appPrincipalId, roles.monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ---------------------------------------------------------------------------
// Deploying principal (optional)
// ---------------------------------------------------------------------------

resource deployerBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (grantDeployer) {
  name: guid(storage.id, principalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: principalId
    principalType: principalType
  }
}

resource deployerTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (grantDeployer) {
  name: guid(storage.id, principalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: principalId
    principalType: principalType
  }
}

resource deployerServiceBusSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (grantDeployer) {
  name: guid(serviceBus.id, principalId, roles.serviceBusDataSender)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: principalId
    principalType: principalType
  }
}

resource deployerServiceBusReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (grantDeployer) {
  name: guid(serviceBus.id, principalId, roles.serviceBusDataReceiver)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: principalId
    principalType: principalType
  }
}
