// Log Analytics + workspace-based Application Insights.
//
// Azure Verified Modules: both resources are used with their defaults plus a few switches,
// which is what the AVMs are good at. Local (key-based) ingestion is disabled, so the
// Function App sends telemetry with its managed identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING
// in function.bicep) and needs Monitoring Metrics Publisher (rbac.bicep).

@description('Name of the Log Analytics workspace.')
param logAnalyticsName string

@description('Name of the Application Insights component.')
param applicationInsightsName string

@description('Region of both resources.')
param location string

@description('Tags of both resources.')
param tags object

@description('Days Log Analytics keeps data; 30 is included in the ingestion price.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

module logAnalytics 'br/public:avm/res/operational-insights/workspace:0.11.1' = {
  name: 'logAnalytics'
  params: {
    name: logAnalyticsName
    location: location
    tags: tags
    dataRetention: retentionInDays
  }
}

module applicationInsights 'br/public:avm/res/insights/component:0.6.0' = {
  name: 'applicationInsights'
  params: {
    name: applicationInsightsName
    location: location
    tags: tags
    workspaceResourceId: logAnalytics.outputs.resourceId
    disableLocalAuth: true
  }
}

output applicationInsightsName string = applicationInsights.outputs.name
output applicationInsightsId string = applicationInsights.outputs.resourceId
output logAnalyticsId string = logAnalytics.outputs.resourceId
