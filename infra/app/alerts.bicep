// Azure Monitor alerts: who hears that something needs a person (docs/operations.md#alerts).
//
// One action group (an email address, plus any existing action groups passed in) and four
// rules, one per thing the app cannot fix by itself:
// - an operator alert was raised (a message arrived on operator-alerts);
// - a message was dead-lettered on any queue;
// - an order reached Error (the app's own orders.completed metric, outcome Error);
// - the Supervisor stopped running (neither a successful invocation nor a sweep recorded).
// tests/infra/test_alerts_infra.py checks each rule against the names the code uses
// (shared/contract.py Queue, shared/telemetry/metrics.py, the Supervisor's function name).

@description('Name of the action group the rules notify.')
param actionGroupName string

@description('Region of the log alert rules (the workspace\'s); metric alerts and the action group are global.')
param location string

@description('Tags of every resource here.')
param tags object

@description('Email address the action group notifies of every alert.')
@minLength(3)
param alertEmail string

@description('Resource ids of existing action groups (an on-call rotation, a chat channel) also notified of every alert.')
param extraActionGroupIds array = []

@description('Service Bus namespace whose queues are watched.')
param serviceBusNamespaceName string

@description('Log Analytics workspace the app\'s telemetry lands in (Application Insights is workspace-based).')
param logAnalyticsWorkspaceId string

@description('How long without a Supervisor sweep before it counts as not running: the log alert\'s window.')
@allowed([
  'PT10M'
  'PT15M'
  'PT30M'
  'PT1H'
])
param supervisorSilence string = 'PT15M'

// The names the rules read, as the code writes them.
var operatorAlertsQueue = 'operator-alerts'
var supervisorFunction = 'supervisor'
var ordersCompletedMetric = 'orders.completed'
var outcomeAttribute = 'order.outcome'
var errorState = 'Error'
var sweepMetric = 'orders.supervisor.sweep.duration'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: actionGroupName
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: 'orders'
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

// The metric alerts' form (a list of {actionGroupId}); the log alerts take the ids alone.
var actionGroupIds = concat([actionGroup.id], extraActionGroupIds)
var metricAlertActions = [for id in actionGroupIds: { actionGroupId: id }]

// An operator alert: any message arriving on operator-alerts. Its body says which order
// and why (docs/contract.md#56-operator-alert); the queue keeps it for operatorAlertsTimeToLive.
resource operatorAlertRaised 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'operator-alert-raised'
  location: 'global'
  tags: tags
  properties: {
    description: 'An operator alert arrived on operator-alerts: an order needs a person (docs/operations.md#alerts).'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'alerts-arrived'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'IncomingMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                operatorAlertsQueue
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Total'
        }
      ]
    }
    actions: metricAlertActions
  }
}

// Dead letters on any queue, each queue its own alert (EntityName '*'): a poison message,
// or one that ran out of deliveries. It resolves once the queue's dead letters are handled
// (python -m shared.cli deadletters).
resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'A queue holds dead-lettered messages (docs/operations.md#alerts).'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'dead-lettered'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: metricAlertActions
  }
}

// Orders that reached Error in the window: the app counts each order at its end state
// (orders.completed, with its state as order.outcome). Metrics are never sampled.
resource ordersInError 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'orders-held-in-error'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Orders held in Error'
    description: 'Orders reached Error and wait for an operator: python -m shared.cli failures (docs/operations.md#alerts).'
    severity: 2
    enabled: true
    scopes: [
      logAnalyticsWorkspaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: false
    criteria: {
      allOf: [
        {
          query: 'AppMetrics | where Name == "${ordersCompletedMetric}" and tostring(Properties["${outcomeAttribute}"]) == "${errorState}" | summarize held = sum(Sum)'
          metricMeasureColumn: 'held'
          timeAggregation: 'Total'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

// The Supervisor not running: no successful invocation of its timer (the Functions host's
// request) and no sweep recorded by the app (its heartbeat metric) in supervisorSilence.
// Without it no expired step is retried and no stuck order recovered. Right after the
// first provision, before the code is deployed, it fires once.
resource supervisorNotRunning 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'supervisor-not-running'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Supervisor not running'
    description: 'No Supervisor sweep recorded in the window: expired steps are not retried and stuck orders not recovered (docs/operations.md#alerts).'
    severity: 1
    enabled: true
    scopes: [
      logAnalyticsWorkspaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: supervisorSilence
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: 'union (AppRequests | where Name == "${supervisorFunction}" and Success == true), (AppMetrics | where Name == "${sweepMetric}")'
          timeAggregation: 'Count'
          operator: 'LessThan'
          threshold: 1
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

output actionGroupId string = actionGroup.id
