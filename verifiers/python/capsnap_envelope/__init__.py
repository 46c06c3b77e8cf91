"""capsnap's envelope (docs/ENVELOPE.md), checked in Python.

The envelope is the compact JWS (EdDSA, Ed25519) capsnap attaches to an
allowed ``tools/call`` as the request header ``x-capsnap-envelope``, binding
the call it authorized to the contract it authorized it against. A server
checks it at handler start, before any side effect: :class:`Verifier` does
the checking; :mod:`capsnap_envelope.mcp` guards a server on the ``mcp``
SDK with it.

JWS is checked with joserfc (by the Authlib maintainers): typed, maintained,
and every call takes an explicit allowlist of algorithms, checked against
the key's type, so that neither ``none`` nor an HMAC keyed with the public
key can pass for EdDSA. Canonical JSON is ``rfc8785`` (Trail of Bits), pure
Python, with no dependencies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785
from joserfc import jws
from joserfc.errors import JoseError, UnsupportedAlgorithmError
from joserfc.jwk import OKPKey

__all__ = [
    "ALGORITHM",
    "CODE_REFUSED",
    "HEADER",
    "ISSUER",
    "TYPE",
    "Call",
    "EnvelopeError",
    "Reason",
    "Verifier",
    "args_digest",
    "tool_digest",
]

HEADER = "x-capsnap-envelope"
"""The request header that carries the envelope."""
TYPE = "capsnap-envelope+jwt"
"""The envelope's ``typ``: a JWS of another type under the same key (an audit checkpoint) is never an envelope."""
ISSUER = "capsnap"
"""The ``iss`` of every envelope."""
ALGORITHM = "EdDSA"
"""The only algorithm an envelope is signed with."""
CODE_REFUSED = -31000
"""The JSON-RPC error code of a refusal (capsnap's own denials use it too)."""

class _EnvelopeRegistry(jws.JWSRegistry):
    """joserfc's JWS registry, allowing EdDSA and nothing else.

    joserfc's own get_alg warns (SecurityWarning) on every use of "EdDSA":
    RFC 9864 deprecates that name in favour of the fully specified
    "Ed25519". capsnap's envelope format names it "EdDSA" (RFC 8037), and
    this verifier accepts it with Ed25519 keys only, so the warning says
    nothing a server's operator could act on.
    """

    def get_alg(self, name: str) -> Any:
        if name != ALGORITHM:
            raise UnsupportedAlgorithmError(f"Algorithm of {name!r} is not allowed")
        return jws.JWSRegistry.algorithms[ALGORITHM]


_REGISTRY = _EnvelopeRegistry(algorithms=[ALGORITHM])


class Reason:
    """Why a call is refused: its JSON-RPC error's ``data.reason``."""

    MISSING = "envelope_missing"
    INVALID = "envelope_invalid"
    EXPIRED = "envelope_expired"
    FOREIGN = "envelope_foreign"
    REPLAYED = "envelope_replayed"
    MISMATCH = "envelope_mismatch"
    HANDLER_DRIFT = "handler_drift"


class EnvelopeError(Exception):
    """A refusal: ``reason`` is one of :class:`Reason`'s, ``detail`` says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_SAFE_INT = 2**53 - 1


def _jcs(value: Any) -> bytes:
    """RFC 8785 canonical form of a parsed JSON value.

    JCS reads every number as an IEEE 754 double, as capsnap (Go) and
    JavaScript do; rfc8785 refuses a Python int beyond 2**53 instead, so
    such an int is first made the double it denotes.
    """

    def doubles(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
            return v
        if isinstance(v, int):
            return v if -_SAFE_INT <= v <= _SAFE_INT else float(v)
        if isinstance(v, Mapping):
            return {k: doubles(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [doubles(x) for x in v]
        raise TypeError(f"not a JSON value: {type(v).__name__}")

    return rfc8785.dumps(doubles(value))


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def args_digest(arguments: Any) -> str:
    """The digest an envelope binds a call's arguments by.

    ``"sha256:"`` and the hex SHA-256 of their RFC 8785 canonical form,
    ``{}`` when the call has none. Raises ``ValueError`` (or ``TypeError``)
    if they cannot be canonicalized.
    """
    return _sha256(b"{}" if arguments is None else _jcs(arguments))


# The members of a tool definition that decide what the model plans against
# and what the server accepts (mcpparse/digest.go): _meta, icons and
# execution do not count.
_GOVERNING = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


def tool_digest(definition: Mapping[str, Any]) -> str:
    """capsnap's schema digest of one tool definition, as the server lists it.

    ``"sha256:"`` and the hex SHA-256 of the RFC 8785 canonical form of its
    governing members, absent ones omitted (``capsnap digest``). The
    definition is the JSON object of a tools/list entry, with the wire's
    member names (``inputSchema``, not ``input_schema``).
    """
    governing: dict[str, Any] = {}
    for k in _GOVERNING:
        if k not in definition:
            continue
        v = definition[k]
        if k in ("name", "title", "description"):
            if not isinstance(v, str):
                raise ValueError(f"tool digest: {k} must be a string")
        elif not isinstance(v, Mapping):
            raise ValueError(f"tool digest: {k} must be an object")
        governing[k] = v
    if not governing.get("name"):
        raise ValueError("tool digest: the definition has no name")
    return _sha256(_jcs(governing))


_UNSET: Any = object()


@dataclass(frozen=True)
class Call:
    """What the handler is about to run, which the envelope must be about.

    ``request_id`` is the JSON-RPC id, if the SDK exposes it (``_UNSET``
    skips the check); ``schema_digest`` is the digest of the handler's own
    definition (``None`` leaves that check to the caller).
    """

    tool: str
    arguments: Any = None
    request_id: Any = _UNSET
    schema_digest: str | None = None


# Every claim, and its type. An envelope has each, and no other: a member
# this verifier does not know could be a restriction it would not enforce.
_CLAIMS = {
    "iss": "string", "aud": "string", "sub": "string", "iat": "integer", "exp": "integer", "jti": "string",
    "epoch": "string", "tool": "string", "schema_digest": "string", "effect_class": "string",
    "policy_digest": "string", "args_digest": "string", "rid": "id",
}  # fmt: skip
_REQUIRED = ("jti", "tool", "schema_digest", "args_digest")


def _b64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _strict_json(data: bytes) -> Any:
    """JSON, refusing duplicate members and NaN/Infinity."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ValueError(f"duplicate member {k!r}")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)


class Verifier:
    """Checks envelopes for one server.

    Give exactly one of ``jwks_file``, ``jwks_url`` and ``jwks``. A JWKS
    URL (capsnap's ``GET /.well-known/jwks.json``) is fetched on first use,
    kept for ``refresh`` seconds, and fetched again when an envelope names a
    kid it lacks, at most every ``cooldown`` seconds: that is how a verifier
    follows a key rotation. ``leeway`` is the clock skew allowed at exp, in
    seconds; ``now`` the clock, in seconds since the epoch.

    Thread-safe. ``verify`` may block on a JWKS fetch (5 s at most); from
    async code, call it in a worker thread when ``jwks_url`` is set.
    """

    def __init__(
        self,
        audience: str,
        *,
        jwks_file: str | None = None,
        jwks_url: str | None = None,
        jwks: Mapping[str, Any] | None = None,
        refresh: float = 300.0,
        cooldown: float = 1.0,
        leeway: float = 5.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        if not audience:
            raise ValueError("capsnap envelope: a verifier needs its server's id (audience)")
        if sum(x is not None for x in (jwks_file, jwks_url, jwks)) != 1:
            raise ValueError("capsnap envelope: give a verifier exactly one of jwks_file, jwks_url and jwks")
        self.audience = audience
        self.jwks_url = jwks_url
        self._refresh, self._cooldown, self._leeway, self._now = refresh, cooldown, leeway, now
        self._lock = threading.Lock()
        self._keys: dict[str, OKPKey] | None = None
        self._fetched_at = 0.0  # monotonic
        self._seen: dict[str, int] = {}  # jti -> exp, until exp (+ leeway) has passed
        self._pruned = 0.0
        if jwks_file is not None:
            with open(jwks_file, "rb") as f:
                self._keys = _parse_jwks(f.read(), jwks_file)
        elif jwks is not None:
            self._keys = _parse_jwks(json.dumps(jwks).encode(), "jwks")

    def verify(self, token: str | None, call: Call) -> dict[str, Any]:
        """Check ``token`` as the envelope of ``call`` and return its claims.

        A refusal raises :class:`EnvelopeError`. A call refused does not
        use up its envelope: only one that verified in full is remembered.
        """
        if not token:
            raise EnvelopeError(Reason.MISSING, f"the call carries no {HEADER} header")
        if not isinstance(token, str):
            raise EnvelopeError(Reason.INVALID, f"{HEADER} is not one string")
        parts = token.split(".")
        if len(parts) != 3:
            raise EnvelopeError(Reason.INVALID, "not a compact JWS")
        try:
            header = _strict_json(_b64url(parts[0]))
        except (ValueError, binascii.Error) as e:
            raise EnvelopeError(Reason.INVALID, f"not a compact JWS: {e}") from None
        if not isinstance(header, dict):
            raise EnvelopeError(Reason.INVALID, "not a compact JWS: the header is not an object")
        if header.get("alg") != ALGORITHM:
            raise EnvelopeError(Reason.INVALID, f"alg {json.dumps(header.get('alg'))}, want {ALGORITHM}")
        if header.get("typ") != TYPE:
            raise EnvelopeError(Reason.INVALID, f"typ {json.dumps(header.get('typ'))}, want {TYPE}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise EnvelopeError(Reason.INVALID, "the envelope names no kid")
        key = self._key(kid)
        try:
            payload = jws.deserialize_compact(token, key, registry=_REGISTRY).payload
        except JoseError as e:
            raise EnvelopeError(Reason.INVALID, f"the signature does not verify under key {kid!r}: {e}") from None
        except (ValueError, TypeError) as e:
            raise EnvelopeError(Reason.INVALID, f"not a compact EdDSA JWS: {e}") from None
        c = _parse_claims(payload)

        if c["iss"] != ISSUER or c["aud"] != self.audience:
            raise EnvelopeError(
                Reason.FOREIGN, f"issued by {c['iss']!r} for {c['aud']!r}; this is {self.audience!r}"
            )
        t = self._now()
        if t > c["exp"] + self._leeway:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c["exp"]))
            raise EnvelopeError(Reason.EXPIRED, f"expired at {at}")
        if c["tool"] != call.tool:
            raise EnvelopeError(Reason.MISMATCH, f"the envelope is for tool {c['tool']!r}, the call is to {call.tool!r}")
        try:
            args = args_digest(call.arguments)
        except (ValueError, TypeError) as e:
            raise EnvelopeError(Reason.MISMATCH, f"the call's arguments cannot be canonicalized: {e}") from None
        if args != c["args_digest"]:
            raise EnvelopeError(
                Reason.MISMATCH, f"the envelope binds arguments {c['args_digest']}, the call has {args}"
            )
        # Compared as JSON values, canonically: 7 and 7.0 are one id, 7 and "7" two.
        if call.request_id is not _UNSET and _jcs_or_none(call.request_id) != _jcs_or_none(c["rid"]):
            raise EnvelopeError(
                Reason.MISMATCH, f"the envelope is for request {c['rid']!r}, this is {call.request_id!r}"
            )
        if call.schema_digest is not None and call.schema_digest != c["schema_digest"]:
            raise EnvelopeError(
                Reason.HANDLER_DRIFT,
                f"authorized against {c['schema_digest']}, the handler serves {call.schema_digest}",
            )
        self._remember(c["jti"], c["exp"], t)
        return c

    def _remember(self, jti: str, exp: int, t: float) -> None:
        with self._lock:
            if jti in self._seen:
                raise EnvelopeError(Reason.REPLAYED, f"envelope {jti} was already used")
            if t - self._pruned > 1:
                for k in [k for k, e in self._seen.items() if e + self._leeway < t]:
                    del self._seen[k]
                self._pruned = t
            self._seen[jti] = exp

    def _key(self, kid: str) -> OKPKey:
        with self._lock:
            if self.jwks_url is not None:
                age = time.monotonic() - self._fetched_at
                stale = self._keys is None or age > self._refresh
                if not stale and kid not in self._keys and age > self._cooldown:  # type: ignore[operator]
                    stale = True  # a key capsnap rotated to
                if stale:
                    try:
                        self._fetch()
                    except Exception as e:  # never fail open: refuse
                        if self._keys is None:
                            raise EnvelopeError(
                                Reason.INVALID, f"the JWKS at {self.jwks_url} could not be fetched: {e}"
                            ) from None
            key = (self._keys or {}).get(kid)
        if key is None:
            raise EnvelopeError(Reason.INVALID, f"no key {kid!r} in the JWKS")
        return key

    def _fetch(self) -> None:
        assert self.jwks_url is not None
        self._fetched_at = time.monotonic()  # a failed fetch waits out the cooldown too
        req = urllib.request.Request(self.jwks_url, headers={"accept": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 (the operator's URL)
            data = resp.read(1 << 20)
        self._keys = _parse_jwks(data, self.jwks_url)


def _jcs_or_none(v: Any) -> bytes | None:
    try:
        return _jcs(v)
    except (ValueError, TypeError):
        return None


def _parse_jwks(data: bytes, where: str) -> dict[str, OKPKey]:
    try:
        jwks = _strict_json(data)
    except ValueError as e:
        raise ValueError(f"capsnap envelope: {where}: not a JSON Web Key Set: {e}") from None
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        raise ValueError(f"capsnap envelope: {where}: not a JSON Web Key Set")
    keys: dict[str, OKPKey] = {}
    for k in jwks["keys"]:
        if (
            not isinstance(k, dict)
            or not isinstance(k.get("kid"), str)
            or not k["kid"]
            or "d" in k
            or k.get("kty") != "OKP"
            or k.get("crv") != "Ed25519"
        ):
            raise ValueError(f"capsnap envelope: {where}: every key must be a public Ed25519 key with a kid")
        if k["kid"] in keys:
            raise ValueError(f"capsnap envelope: {where}: kid {k['kid']!r} names two keys")
        keys[k["kid"]] = OKPKey.import_key(k)
    return keys


def _parse_claims(payload: bytes) -> dict[str, Any]:
    try:
        c = _strict_json(payload)
    except ValueError as e:
        raise EnvelopeError(Reason.INVALID, f"claims: {e}") from None
    if not isinstance(c, dict):
        raise EnvelopeError(Reason.INVALID, "claims: not a JSON object")
    for k in c:
        if k not in _CLAIMS:
            raise EnvelopeError(Reason.INVALID, f"claims: unknown claim {k!r}")
    for k, kind in _CLAIMS.items():
        if k not in c:
            raise EnvelopeError(Reason.INVALID, f"claims: {k} is missing")
        v = c[k]
        if kind == "integer":
            ok = type(v) is int and -_SAFE_INT <= v <= _SAFE_INT
        elif kind == "id":
            ok = v is None or type(v) in (str, int) or (type(v) is float and math.isfinite(v))
        else:
            ok = type(v) is str
        if not ok:
            raise EnvelopeError(Reason.INVALID, f"claims: {k} is not a{'n' if kind == 'integer' else ''} {kind}")
    if any(c[k] == "" for k in _REQUIRED) or c["exp"] == 0:
        raise EnvelopeError(Reason.INVALID, "a claim is missing")
    return c
