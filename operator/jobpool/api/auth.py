"""Bearer-token authentication of the admin API (admins only).

A token is a JWT signed with HS256 (a shared secret) or RS256/ES256 (a public key from a
PEM file, inline PEM, or a JWKS file). It must carry `exp`, `sub` and the configured `aud`;
its `permissions` claim (a list) must contain `manage_metadata`. `sub` becomes the audit
actor. Each key only verifies its own algorithm, so a public key is never used as an HMAC
secret and `alg: none` is never accepted.

Its `tenants` claim names the tenants the token may act for: a list of tenant keys, or `"*"`
for every tenant (a platform administrator). A token without the claim is refused (403):
an issuer that does not know about tenant scopes must not hand out every tenant by omission.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from jobpool.configfile import read_config_file
from jobpool.core.tenants import TENANT_ID, TENANT_KEY
from jobpool.errors import JobpoolError

PERMISSION = "manage_metadata"
MIN_SECRET_BYTES = 32
"""RFC 7518 §3.2: an HS256 key has at least as many bits as the hash (256)."""
LEEWAY = 5.0
"""Seconds of clock skew tolerated on `exp`, `nbf` and `iat`."""
MAX_SUBJECT = 256
TENANTS_CLAIM = "tenants"
EVERY_TENANT = "*"
MAX_SCOPE_TENANTS = 1000
"""Tenant keys one token may list; more is a platform-wide token in disguise."""
B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750 credentials of a Bearer header; a JWT (base64url segments and dots) is one."""


class AuthError(JobpoolError):
    """A refused request: 401 (no valid token) or 403 (valid token, no permission)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the token's `sub` and the tenant keys it may act for.

    tenants: the tenant keys, sorted, or None for a platform-wide token (`"tenants": "*"`).
    """

    subject: str
    tenants: tuple[str, ...] | None

    @property
    def scope(self) -> str | list[str]:
        """The scope as the audit rows record it: `"*"` or the list of tenant keys."""
        return EVERY_TENANT if self.tenants is None else list(self.tenants)


def token_tenants(claims: Mapping[str, Any], subject: str) -> tuple[str, ...] | None:
    """The tenant keys of the `tenants` claim (sorted, unique), or None for `"*"`.

    Raises AuthError(403) when the claim is missing (a scope is never implied), AuthError(401)
    when it is neither `"*"` nor a list of 1 to MAX_SCOPE_TENANTS tenant keys.
    """
    if TENANTS_CLAIM not in claims:
        raise AuthError(403, f"token of {subject!r} lacks the {TENANTS_CLAIM!r} claim: a list "
                             f"of tenant keys, or {EVERY_TENANT!r} for every tenant")
    value = claims[TENANTS_CLAIM]
    if value == EVERY_TENANT:
        return None
    shape = (f"token claim {TENANTS_CLAIM!r} must be {EVERY_TENANT!r} or a list of 1 to "
             f"{MAX_SCOPE_TENANTS} tenant keys")
    if not isinstance(value, list) or not 0 < len(value) <= MAX_SCOPE_TENANTS:
        raise AuthError(401, shape)
    for key in value:
        if not isinstance(key, str) or not TENANT_KEY.fullmatch(key):
            raise AuthError(401, f"{shape}; {str(key)[:80]!r} is not a tenant key")
        if TENANT_ID.fullmatch(key):  # a key never looks like one, so it would match nothing
            raise AuthError(401, f"{shape}; {key!r} is a tenant id, not a tenant key (the "
                                 "`key` column of `jobpool tenants list`)")
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class VerifyKey:
    """One key and the single algorithm it verifies; kid None matches any token."""

    algorithm: str
    key: Any
    kid: str | None = None


@dataclass(frozen=True)
class TokenVerifier:
    """Verifies bearer tokens against the configured keys and audience."""

    keys: tuple[VerifyKey, ...]
    audience: str

    def principal(self, authorization: str | None) -> Principal:
        """The token's subject and tenant scope, from an `Authorization` header value.

        Raises AuthError(401) for a missing, malformed, expired, wrongly signed or
        wrongly addressed token, one whose `sub` is not printable text, or a malformed
        `tenants` claim, AuthError(403) for a token without `manage_metadata` or without a
        `tenants` claim.
        """
        token = _bearer(authorization)
        claims = self._decode(token)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not 0 < len(subject) <= MAX_SUBJECT:
            raise AuthError(401, f"token sub must be a string of 1 to {MAX_SUBJECT} characters")
        if not subject.isprintable():  # it goes to audit rows, which cannot hold NUL
            raise AuthError(401, "token sub must be printable text: no control characters, "
                                 "lone surrogates or line breaks")
        permissions = claims.get("permissions")
        if not isinstance(permissions, list) or PERMISSION not in permissions:
            raise AuthError(403, f"token of {subject!r} lacks the permission {PERMISSION!r}")
        return Principal(subject, token_tenants(claims, subject))

    def _decode(self, token: str) -> Mapping[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise AuthError(401, f"malformed token: {exc}") from None
        algorithm, kid = header.get("alg"), header.get("kid")
        candidates = [k for k in self.keys if k.algorithm == algorithm
                      and (k.kid is None or kid is None or k.kid == kid)]
        if not candidates:
            accepted = ", ".join(sorted({k.algorithm for k in self.keys}))
            raise AuthError(401, f"token signed with {algorithm!r}; this API accepts {accepted}"
                                 f"{f' with kid {kid!r}' if kid else ''}")
        failure: AuthError | None = None
        for candidate in candidates:
            try:
                claims: Mapping[str, Any] = jwt.decode(
                    token, candidate.key, algorithms=[candidate.algorithm],
                    audience=self.audience, leeway=LEEWAY,
                    options={"require": ["exp", "sub", "aud"]})
            except jwt.PyJWTError as exc:
                failure = _explain(exc, self.audience)
                if not isinstance(exc, jwt.InvalidSignatureError):
                    break
            else:
                return claims
        assert failure is not None
        raise failure


def _bearer(authorization: str | None) -> str:
    """The token of a `Bearer <token>` header value; anything else is refused with 401 before
    any decoding (a header can carry any byte, e.g. 0xff, which no JWT contains)."""
    if not authorization:
        raise AuthError(401, "missing Authorization header (expected: Bearer <JWT>)")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError(401, "malformed Authorization header (expected: Bearer <JWT>)")
    if not B64TOKEN.fullmatch(token.strip()):
        raise AuthError(401, "malformed token: a JWT holds only base64url characters and dots")
    return token.strip()


def _explain(exc: jwt.PyJWTError, audience: str) -> AuthError:
    if isinstance(exc, jwt.ExpiredSignatureError):
        return AuthError(401, "token expired")
    if isinstance(exc, jwt.InvalidAudienceError):
        return AuthError(401, f"token is not for this API (audience must be {audience!r})")
    if isinstance(exc, jwt.InvalidSignatureError):
        return AuthError(401, "token signature does not verify")
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return AuthError(401, f"token lacks the {exc.claim!r} claim")
    return AuthError(401, f"invalid token: {exc}")


# -- configuration ------------------------------------------------------------------------


def load_verifier(*, secret: str | None, public_key: str | None,
                  audience: str | None) -> TokenVerifier:
    """A verifier from JOBPOOL_API_JWT_SECRET / _PUBLIC_KEY / _AUDIENCE values.

    public_key: a path to a PEM public key or a JWKS file, or inline PEM text.
    Raises ValueError naming the missing or unusable setting.
    """
    if not secret and not public_key:
        raise ValueError(
            "the admin API needs a token key: set JOBPOOL_API_JWT_SECRET (HS256) or "
            "JOBPOOL_API_JWT_PUBLIC_KEY (a PEM or JWKS file for RS256/ES256)")
    if not audience:
        raise ValueError("set JOBPOOL_API_JWT_AUDIENCE: tokens must name this API as audience")
    keys: list[VerifyKey] = []
    if secret:
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"JOBPOOL_API_JWT_SECRET must be at least {MIN_SECRET_BYTES} "
                             "bytes for HS256")
        keys.append(VerifyKey("HS256", secret))
    if public_key:
        keys += _public_keys(public_key)
    return TokenVerifier(tuple(keys), audience)


def _public_keys(value: str) -> list[VerifyKey]:
    text = value
    where = "JOBPOOL_API_JWT_PUBLIC_KEY"
    if not value.lstrip().startswith("-----BEGIN"):
        path = Path(value).expanduser()
        where = f"JOBPOOL_API_JWT_PUBLIC_KEY file {path}"
        try:
            text = read_config_file(path)  # bounded: the path may name a device
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if text.lstrip().startswith("{"):
        return _jwks_keys(text, where)
    return [_pem_key(text, where)]


def _pem_key(text: str, where: str) -> VerifyKey:
    try:
        key = load_pem_public_key(text.encode())
    except ValueError as exc:
        raise ValueError(f"{where}: not a PEM public key ({exc})") from None
    if isinstance(key, rsa.RSAPublicKey):
        return VerifyKey("RS256", key)
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return VerifyKey("ES256", key)
    raise ValueError(f"{where}: only RSA (RS256) and P-256 EC (ES256) public keys are supported")


def _jwks_keys(text: str, where: str) -> list[VerifyKey]:
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("expected a JSON object")
        found = document.get("keys", [document])
        keys = [jwt.PyJWK(entry) for entry in found]
    except (ValueError, KeyError, TypeError, jwt.PyJWKError) as exc:
        raise ValueError(f"{where}: not a usable JWKS document ({exc})") from None
    usable = [VerifyKey(k.algorithm_name, k.key, k.key_id) for k in keys
              if k.algorithm_name in ("RS256", "ES256")]
    if not usable:
        raise ValueError(f"{where}: no RS256 or ES256 key in the JWKS document")
    return usable
