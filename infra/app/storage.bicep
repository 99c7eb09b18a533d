// The one storage account: the Functions host (blobs: leases, timer schedule, keys), the
// Flex Consumption deployment package (a blob container) and the app's state table.
//
// Plain resources rather than the storage AVM: the properties below (no shared keys, TLS,
// no public blobs) and the state table are exactly what tests/infra checks against the
// code, and they read more plainly here than through the module's own parameter names.

@description('Storage account name: 3-24 lowercase letters and digits, globally unique.')
@minLength(3)
@maxLength(24)
param name string

@description('Region of the account.')
param location string

@description('Tags of the account.')
param tags object

@description('Redundancy: LRS keeps three copies in one datacenter and is the cheapest; ZRS also survives the loss of a zone.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
])
param skuName string = 'Standard_ZRS'

@description('Blob container Flex Consumption deploys the app package to.')
param deploymentContainerName string

@description('Blob container of archived orders (shared/contract.py ARCHIVE_CONTAINER).')
param archiveContainerName string = 'order-archive'

@description('Table holding orders and their process state (StateTableName).')
param stateTableName string

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: Flex Consumption without VNet integration reaches its host storage, deployment container and the state table over the public endpoint; shared keys are off, so only the app's identity (and the deploying user's) gets in
  // checkov:skip=CKV_AZURE_206: zone-redundant (ZRS) by default; geo-replication alone would not make orders recoverable in another region, since the app and its Service Bus namespace live in one region
  // checkov:skip=CKV_AZURE_59: the same: public network access is how a Flex Consumption app without a VNet reaches the account; access is by Entra ID roles only (no keys, no public blobs)
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    dnsEndpointType: 'Standard'
    minimumTlsVersion: 'TLS1_2'
    publicNetworkAccess: 'Enabled'
    supportsHttpsTrafficOnly: true
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

// Finished orders past their retention, as gzip JSON lines by day (docs/operations.md).
// Created here so the app's grant can be scoped to it.
resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: archiveContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

// The code creates the table on first use as well (TableStateStore.ensure_table), but
// creating it here means the first request never waits on it and a typo shows at deploy time.
resource stateTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: stateTableName
}

output name string = account.name
output id string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
output tableEndpoint string = account.properties.primaryEndpoints.table
output deploymentContainerName string = deploymentContainer.name
output archiveContainerName string = archiveContainer.name
output stateTableName string = stateTable.name
