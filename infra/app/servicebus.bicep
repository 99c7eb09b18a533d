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

@description('The queues the app consumes: shared/contract.py ALL_QUEUES but the notification queues.')
@minLength(1)
param queueNames array

@description('The queues the app only writes (shared/contract.py NOTIFICATION_QUEUES), each as {name, timeToLive}: timeToLive is an ISO 8601 duration after which an unread message is dropped.')
param notificationQueues array

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
// - expired messages are dead-lettered too (none expire: a work message has no time-to-live).
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

// The notification queues (status notifications, operator alerts): read by clients and
// operators outside the app (docs/operations.md#who-reads-the-notification-queues), so a
// reader that is late or gone must not fill them up to the namespace's size cap. Their
// messages expire after a set time and are then dropped, not dead-lettered
// (shared/contract.py NOTIFICATION_QUEUE_PROPERTIES): an order's state is in the table,
// and an operator alert has raised its Azure Monitor alert (alerts.bicep) when it arrived.
resource notificationQueueResources 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [
  for queue in notificationQueues: {
    parent: namespace
    name: queue.name
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      defaultMessageTimeToLive: queue.timeToLive
      deadLetteringOnMessageExpiration: false
      requiresSession: false
      enablePartitioning: false
    }
  }
]

output name string = namespace.name
output id string = namespace.id
// serviceBusEndpoint is https://<name>.servicebus.windows.net:443/ (or a sovereign cloud's suffix).
output fullyQualifiedNamespace string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
