"""`OperatorAuth=token`: an Entra bearer token validated in the app, with PyJWT, where
the plan has no platform authentication (docs/sign-in.md).

The signature is checked against the tenant's published keys (its JWKS), fetched by
PyJWKClient and cached by it; the issuer, the audience and the times are checked as
well. Any failure is NotSignedIn with the reason, which the route answers as a 401.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import jwt

from shared.domain.principal import NotSignedIn, Principal, TokenPolicy, principal_from_claims

ALGORITHMS: Final = ["RS256"]
"""What Entra signs access tokens with; a token naming another algorithm (`none`, or
HS256 with the public key as its secret) is refused before its signature is read."""
LEEWAY_SECONDS: Final = 60
JWKS_TIMEOUT_SECONDS: Final = 3
JWKS_CACHE_SECONDS: Final = 3600


class EntraTokens:
    """One per policy and process: it keeps the tenant's keys between requests."""

    def __init__(self, policy: TokenPolicy) -> None:
        self.policy = policy
        self._keys = jwt.PyJWKClient(
            policy.jwks_url,
            cache_keys=True,
            lifespan=JWKS_CACHE_SECONDS,
            timeout=JWKS_TIMEOUT_SECONDS,
        )

    async def principal(self, token: str) -> Principal:
        """PyJWKClient fetches with urllib, so the first fetch runs off the loop."""
        return await asyncio.to_thread(self.validate, token)

    def validate(self, token: str) -> Principal:
        try:
            key = self._keys.get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError:
            raise NotSignedIn("the tenant's signing keys could not be fetched") from None
        except (jwt.PyJWKClientError, jwt.InvalidTokenError) as exc:
            raise NotSignedIn(f"the bearer token cannot be checked: {exc}") from None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=ALGORITHMS,
                audience=list(self.policy.audiences),
                issuer=self.policy.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.InvalidAudienceError:
            raise NotSignedIn("the bearer token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise NotSignedIn("the bearer token is from another issuer") from None
        except jwt.ExpiredSignatureError:
            raise NotSignedIn("the bearer token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise NotSignedIn(f"the bearer token is not valid: {exc}") from None
        return principal_from_claims(claims)


_validators: dict[TokenPolicy, EntraTokens] = {}


def tokens_for(policy: TokenPolicy) -> EntraTokens:
    if policy not in _validators:
        _validators[policy] = EntraTokens(policy)
    return _validators[policy]
