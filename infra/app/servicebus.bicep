// Service Bus namespace and the contract queues.
//
// Plain resources rather than the Service Bus AVM: the queue properties are a contract
// with the code (shared/contract.py QUEUE_PROPERTIES) and tests/infra reads them here,
// one literal per property. Local (SAS) authentication is disabled: the app sends and
// its triggers receive with the managed identity only.

@description('Namespace name: 6-50 letters, digits and hyphens, globally unique.')
@minLength(6)
@maxLength(50)
param name string

@description('Region of the namespace.')
param location string

@description('Tags of the namespace.')
param tags object

@description('Tier. Standard is the cheapest tier with duplicate detection, which the app relies on.')
@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'

@description('Messaging units when sku is Premium; ignored for Standard.')
@allowed([
  1
  2
  4
  8
  16
])
param premiumCapacity int = 1

@description('The queues the app uses: shared/contract.py ALL_QUEUES.')
@minLength(1)
param queueNames array

var premiumSku = { name: 'Premium', tier: 'Premium', capacity: premiumCapacity }
var standardSku = { name: 'Standard', tier: 'Standard' }

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: sku == 'Premium' ? premiumSku : standardSku
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

// What the code assumes of every queue (shared/contract.py QUEUE_PROPERTIES):
// - lockDuration 60 s: the host renews the lock while a function runs (host.json
//   maxAutoLockRenewalDuration), so this only bounds how soon a crashed worker's message returns;
// - maxDeliveryCount 10: then the message is dead-lettered, never dropped;
// - duplicate detection over 10 minutes: every message id is derived from the order and its
//   step, attempt or version, so a send retried after a lost acknowledgement lands once;
// - expired messages are dead-lettered too.
resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [
  for queueName in queueNames: {
    parent: namespace
    name: queueName
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      deadLetteringOnMessageExpiration: true
      requiresSession: false
      enablePartitioning: false
    }
  }
]

output name string = namespace.name
output id string = namespace.id
// serviceBusEndpoint is https://<name>.servicebus.windows.net:443/ (or a sovereign cloud's suffix).
output fullyQualifiedNamespace string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
