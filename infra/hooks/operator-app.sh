#!/bin/sh
# azd preprovision hook: the app registration operators sign in to (docs/sign-in.md).
#
# Does nothing unless OPERATOR_AUTH is token or platform. With OPERATOR_AUTH_CLIENT_ID
# set it takes that registration as it is. Otherwise it creates one in the signed-in
# tenant, with the two app roles the app checks (Orders.Read, Orders.Operate; the names
# are shared/domain/principal.py Role) and v2 access tokens, gives it a service
# principal so roles can be assigned, and stores its client id in the azd environment,
# which main.parameters.json passes to the Bicep as operatorAuthClientId. Assigning the
# roles to people and groups is left to the tenant's admins: docs/sign-in.md says how.
set -eu

mode="${OPERATOR_AUTH:-}"
if [ -z "$mode" ]; then
  echo "operator sign-in: off (OPERATOR_AUTH unset); operators use the master key"
  exit 0
fi
if [ -n "${OPERATOR_AUTH_CLIENT_ID:-}" ]; then
  echo "operator sign-in: $mode, app registration $OPERATOR_AUTH_CLIENT_ID"
  exit 0
fi
command -v az >/dev/null 2>&1 || {
  echo "operator sign-in: creating the app registration needs the Azure CLI (az); install it, or set OPERATOR_AUTH_CLIENT_ID" >&2
  exit 1
}

new_id() { python3 -c 'import uuid; print(uuid.uuid4())'; }
roles=$(mktemp)
trap 'rm -f "$roles"' EXIT
cat >"$roles" <<JSON
[
  {"allowedMemberTypes": ["User", "Application"], "isEnabled": true, "id": "$(new_id)",
   "value": "Orders.Read", "displayName": "Read orders",
   "description": "Every operator read: orders, the operator page, agents, failures, bulk jobs, the archive"},
  {"allowedMemberTypes": ["User", "Application"], "isEnabled": true, "id": "$(new_id)",
   "value": "Orders.Operate", "displayName": "Operate orders",
   "description": "Every action: cancel, suspend, resume, resubmit, drain, bulk, reconcile, migrate, archive, approvals"}
]
JSON

name="orders-operators-${AZURE_ENV_NAME:-local}"
app_id=$(az ad app create --display-name "$name" --sign-in-audience AzureADMyOrg \
  --app-roles "@$roles" --query appId --output tsv)
az ad app update --id "$app_id" --identifier-uris "api://$app_id" \
  --set api.requestedAccessTokenVersion=2 >/dev/null
az ad sp create --id "$app_id" >/dev/null
azd env set OPERATOR_AUTH_CLIENT_ID "$app_id"
echo "operator sign-in: $mode, created app registration $name ($app_id); assign its roles (docs/sign-in.md)"
