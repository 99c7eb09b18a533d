// The Function App on a Flex Consumption (FC1, Linux) plan, running as a user-assigned
// managed identity, with identity-based connections only.
//
// Plain resources rather than the web/site AVM: functionAppConfig (runtime, deployment
// storage, scale) and the app settings are the heart of this deployment and tests/infra
// reads them literally against shared/settings.py.
//
// Flex Consumption rejects the settings it now owns (FUNCTIONS_WORKER_RUNTIME,
// FUNCTIONS_EXTENSION_VERSION, WEBSITE_RUN_FROM_PACKAGE, WEBSITE_CONTENTSHARE, ...):
// the runtime comes from functionAppConfig.runtime and the package from the deployment
// container, so none of them appears below.

@description('Function App name, globally unique (it is the host name).')
param name string

@description('Name of the Flex Consumption plan.')
param planName string

@description('Region of the plan and the app.')
param location string

@description('Tags of the plan and the app; the app also gets azd-service-name.')
param tags object

@description('Resource id of the user-assigned identity the app runs as.')
param identityId string

@description('Client id of that identity: the value of every *__clientId setting.')
param identityClientId string

@description('Storage account of the host, the deployment package and the state table.')
param storageAccountName string

@description('Blob container holding the deployment package.')
param deploymentContainerName string

@description('Application Insights component receiving the telemetry.')
param applicationInsightsName string

@description('Service Bus namespace host name, e.g. sb-xyz.servicebus.windows.net.')
param serviceBusFullyQualifiedNamespace string

@description('Memory of each instance, in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Upper bound on instances.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('StateTableName.')
param stateTableName string

@description('SupervisorSchedule (NCRONTAB).')
param supervisorSchedule string

@description('ReconcileSchedule (NCRONTAB).')
param reconcileSchedule string

@description('ReconcileSampleSize.')
@minValue(1)
@maxValue(1000)
param reconcileSampleSize int

@description('ArchiveSchedule (NCRONTAB).')
param archiveSchedule string

@description('RetentionProcessedDays (0: kept forever).')
@minValue(0)
param retentionProcessedDays int

@description('RetentionCancelledDays (0: kept forever).')
@minValue(0)
param retentionCancelledDays int

@description('RetentionCompensatedDays (0: kept forever).')
@minValue(0)
param retentionCompensatedDays int

@description('StepTimeoutSeconds.')
@minValue(1)
param stepTimeoutSeconds int

@description('PendingTimeoutSeconds.')
@minValue(1)
param pendingTimeoutSeconds int

@description('MaxFailureCount.')
@minValue(1)
param maxFailureCount int

@description('ExhaustedPolicy.')
@allowed([
  'hold'
  'compensate'
])
param exhaustedPolicy string

@description('ReplyToAllowList (comma-separated queue names).')
param replyToAllowList string

@description('The agents\' service URL settings, one {name, value} per catalogue agent: main.bicep builds them from catalogue.json.')
param serviceUrlSettings array

@description('AgentLimits__{agent}__* overrides, one {name, value} each (main.bicep\'s agentLimitSettings).')
param agentLimitSettings array = []

@description('HighPriorityStepTimeoutSeconds.')
@minValue(1)
param highPriorityStepTimeoutSeconds int

@description('StepHeartbeatSeconds.')
@minValue(1)
param stepHeartbeatSeconds int

@description('StepMaxSeconds (0: step heartbeats off).')
@minValue(0)
param stepMaxSeconds int

@description('ClockSkewSeconds.')
@minValue(0)
param clockSkewSeconds int

@description('IntakeMaxPendingPerCustomer (0: no limit).')
@minValue(0)
param intakeMaxPendingPerCustomer int

@description('FairShareRunningPerCustomer (0: off).')
@minValue(0)
param fairShareRunningPerCustomer int

@description('BulkActionsPerSecond.')
@minValue(1)
param bulkActionsPerSecond int

@description('OTEL_TRACES_SAMPLER (the Azure Monitor distro\'s spelling).')
@allowed([
  'parentbased_trace_id_ratio'
  'parentbased_always_on'
  'always_on'
])
param tracesSampler string

@description('OTEL_TRACES_SAMPLER_ARG.')
param tracesSamplerArg string

@description('OperatorAuth: empty (master key only), token or platform (docs/sign-in.md).')
@allowed([
  ''
  'token'
  'platform'
])
param operatorAuth string

@description('Client id of the operators\' app registration (token and platform).')
param operatorAuthClientId string

// Token mode's checks (docs/sign-in.md): this tenant's issuer and published keys, in
// whichever cloud this deploys to; the audience is the app registration, as a v2 token
// names it (its client id) or a v1 token does (its application id URI).
var entraIssuer = '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
var entraKeys = '${environment().authentication.loginEndpoint}${tenant().tenantId}/discovery/v2.0/keys'
var operatorAudiences = '${operatorAuthClientId},api://${operatorAuthClientId}'

// The app settings, as the name/value list of siteConfig.appSettings: these fixed ones,
// then the agents' service URLs that main.bicep derives from catalogue.json
// (serviceUrlSettings). A list, not the sites/config object, because a for-expression
// builds lists: checkov's Bicep parser reads neither toObject() nor lambdas.
var coreAppSettings = [
  // Functions host storage (leases, timer schedule, keys): identity-based. accountName
  // gives the host its blob and queue endpoints; tableServiceUri is what the code's
  // state store uses (shared/settings.py), taken from the account so any cloud works.
  { name: 'AzureWebJobsStorage__accountName', value: storage.name }
  { name: 'AzureWebJobsStorage__tableServiceUri', value: storage.properties.primaryEndpoints.table }
  // The order archive (shared/adapters/blob_archive.py): the same account's blob endpoint,
  // the one the host derives from accountName too.
  { name: 'AzureWebJobsStorage__blobServiceUri', value: storage.properties.primaryEndpoints.blob }
  { name: 'AzureWebJobsStorage__credential', value: 'managedidentity' }
  { name: 'AzureWebJobsStorage__clientId', value: identityClientId }

  // Service Bus: the trigger extension and the code's sender (shared/settings.py).
  { name: 'ServiceBusConnection__fullyQualifiedNamespace', value: serviceBusFullyQualifiedNamespace }
  { name: 'ServiceBusConnection__credential', value: 'managedidentity' }
  { name: 'ServiceBusConnection__clientId', value: identityClientId }

  // Telemetry with Entra ID authentication (local auth is disabled on the component).
  // The connection string only says where to send; it grants nothing by itself.
  { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: applicationInsights.properties.ConnectionString }
  { name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING', value: 'ClientId=${identityClientId};Authorization=AAD' }
  // Read by the distro; errors and recovered orders are kept whatever they say.
  { name: 'OTEL_TRACES_SAMPLER', value: tracesSampler }
  { name: 'OTEL_TRACES_SAMPLER_ARG', value: tracesSamplerArg }

  // DefaultAzureCredential's managed-identity leg defaults to this client id.
  { name: 'AZURE_CLIENT_ID', value: identityClientId }

  // The app's own settings (shared/contract.py Setting).
  { name: 'StateTableName', value: stateTableName }
  { name: 'SupervisorSchedule', value: supervisorSchedule }
  { name: 'ReconcileSchedule', value: reconcileSchedule }
  { name: 'ReconcileSampleSize', value: string(reconcileSampleSize) }
  { name: 'ArchiveSchedule', value: archiveSchedule }
  // Every 5 s: what the two timers ran on when fixed in the code (docs/deploy.md counts them).
  { name: 'AgentHeartbeatSchedule', value: '*/5 * * * * *' }
  { name: 'BulkActionsSchedule', value: '*/5 * * * * *' }
  { name: 'RetentionProcessedDays', value: string(retentionProcessedDays) }
  { name: 'RetentionCancelledDays', value: string(retentionCancelledDays) }
  { name: 'RetentionCompensatedDays', value: string(retentionCompensatedDays) }
  { name: 'StepTimeoutSeconds', value: string(stepTimeoutSeconds) }
  { name: 'PendingTimeoutSeconds', value: string(pendingTimeoutSeconds) }
  { name: 'MaxFailureCount', value: string(maxFailureCount) }
  { name: 'ExhaustedPolicy', value: exhaustedPolicy }
  { name: 'ReplyToAllowList', value: replyToAllowList }
  { name: 'HighPriorityStepTimeoutSeconds', value: string(highPriorityStepTimeoutSeconds) }
  { name: 'StepHeartbeatSeconds', value: string(stepHeartbeatSeconds) }
  { name: 'StepMaxSeconds', value: string(stepMaxSeconds) }
  { name: 'ClockSkewSeconds', value: string(clockSkewSeconds) }
  { name: 'IntakeMaxPendingPerCustomer', value: string(intakeMaxPendingPerCustomer) }
  { name: 'FairShareRunningPerCustomer', value: string(fairShareRunningPerCustomer) }
  { name: 'BulkActionsPerSecond', value: string(bulkActionsPerSecond) }
  { name: 'OperatorAuth', value: operatorAuth }
  { name: 'OperatorAuthIssuer', value: entraIssuer }
  { name: 'OperatorAuthAudience', value: operatorAudiences }
  { name: 'OperatorAuthJwksUrl', value: entraKeys }
]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: Flex Consumption zone redundancy is offered only in some regions and needs always-ready instances (a baseline cost); orders survive an instance loss through the bus and the state table
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: the order API is public by design (clients submit orders with function keys); Flex Consumption without a VNet has no private front door here
  // checkov:skip=CKV_AZURE_17: clients authenticate with function keys, operators with Entra ID (operatorAuth) or the master key, not client certificates; requiring them would break every client
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales from zero on demand; a minimum (always-ready) instance count is a standing cost, and the bus holds work while none runs
  // checkov:skip=CKV_AZURE_213: App Service health check probes instances of Dedicated and Premium plans; on Flex Consumption the platform manages instances, and GET /api/health (anonymous) is there for external probes
  name: name
  location: location
  tags: union(tags, {
    'azd-service-name': 'api'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      appSettings: concat(coreAppSettings, serviceUrlSettings, agentLimitSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
      }
      // The language worker for 3.12 runs asyncio's own event loop and has no app setting
      // for uvloop; the worker for 3.13 and later runs on uvloop (bundled with it) with no
      // setting either. uvloop measured no CPU gain in the local runtime (bench/README.md).
      runtime: {
        name: 'python'
        version: '3.12'
      }
    }
  }
}

// No publishing with basic (user/password) credentials: azd deploys with Entra ID.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

// The platform's authentication, where operatorAuthMode is platform: it validates the
// operator's token or session and passes the principal as X-MS-CLIENT-PRINCIPAL, and
// takes that header off what clients send. Unauthenticated requests go on to the app
// (AllowAnonymous): the intake and events are called by machines with function keys, and
// the app itself answers 401 or 403 on operator routes (docs/contract.md section 15).
resource platformAuth 'Microsoft.Web/sites/config@2024-04-01' = if (operatorAuth == 'platform') {
  // checkov reads a sites/config resource as a whole site and applies the site's checks to it; this one holds only the authentication settings, so the site's own checks (on functionApp above) are the ones that apply:
  // checkov:skip=CKV_AZURE_13: this resource is App Service authentication itself (platform.enabled); checkov looks for the v1 siteAuthEnabled flag
  // checkov:skip=CKV_AZURE_63: HTTP logging is site logging configuration, not part of the authentication settings
  // checkov:skip=CKV_AZURE_65: detailed error messages are site logging configuration, not part of the authentication settings
  // checkov:skip=CKV_AZURE_66: failed request tracing is site logging configuration, not part of the authentication settings
  // checkov:skip=CKV_AZURE_222: public network access is the site's (skipped there with its reason), not the authentication settings'
  // checkov:skip=CKV_AZURE_80: no .NET Framework: the app is Python on Linux
  // checkov:skip=CKV_AZURE_88: Azure Files is a site storage mount; Flex Consumption deploys from a blob container
  parent: functionApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: operatorAuthClientId
          openIdIssuer: entraIssuer
        }
        validation: {
          allowedAudiences: [
            operatorAuthClientId
            'api://${operatorAuthClientId}'
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}

output name string = functionApp.name
output uri string = 'https://${functionApp.properties.defaultHostName}'
output planId string = plan.id
