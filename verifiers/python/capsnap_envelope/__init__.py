"""capsnap's envelope (docs/ENVELOPE.md), checked in Python.

The envelope is the compact JWS (EdDSA, Ed25519) capsnap attaches to an
allowed ``tools/call`` as the request header ``x-capsnap-envelope``, binding
the call it authorized to the contract it authorized it against. A server
checks it at handler start, before any side effect: :class:`Verifier` does
the checking; :mod:`capsnap_envelope.mcp` guards a server on the ``mcp``
SDK with it.

For a server that holds a grant key, capsnap splits the envelope in two
(docs/ENVELOPE.md, "Under a grant"): a grant in ``x-capsnap-grant``, signed
once per snapshot and tool (EdDSA, typ ``capsnap-grant+jwt``), that carries
a call key encrypted to the server (JWE, ECDH-ES on P-256, A256GCM); and, in
``x-capsnap-envelope``, each call's envelope, an HS256 JWS under that call
key (typ ``capsnap-call+jwt``). The verifier opens a grant once and keeps it
until it expires; each call then costs one HMAC.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import rfc8785
from joserfc import jwe, jws
from joserfc.errors import JoseError, UnsupportedAlgorithmError
from joserfc.jwk import ECKey, OctKey, OKPKey

__all__ = [
    "ALGORITHM",
    "CALL_ALGORITHM",
    "CALL_TYPE",
    "CODE_REFUSED",
    "GRANT_HEADER",
    "GRANT_TYPE",
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
GRANT_HEADER = "x-capsnap-grant"
"""The request header that carries the grant an envelope is under, if capsnap sent one."""
GRANT_TYPE = "capsnap-grant+jwt"
"""A grant's ``typ`` (signed with EdDSA under the JWKS's keys, as an envelope signed whole)."""
CALL_TYPE = "capsnap-call+jwt"
"""The ``typ`` of an envelope under a grant."""
CALL_ALGORITHM = "HS256"
"""The only algorithm an envelope under a grant is MAC'd with, under its grant's call key."""
CALL_KEY_SIZE = 32
"""The size of a call key, in bytes: HS256's own."""
MAX_GRANTS = 4096
"""How many grants a verifier keeps open: past it, it drops those expired, then the oldest."""


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
# An envelope under a grant: HS256 and nothing else (joserfc checks the key
# is an oct key, and refuses an empty one).
_CALL_REGISTRY = jws.JWSRegistry(algorithms=[CALL_ALGORITHM])
# A grant's call key: ECDH-ES (direct key agreement) with A256GCM, and no
# other alg, enc or zip.
_KEY_ALGORITHM, _KEY_ENCRYPTION = "ECDH-ES", "A256GCM"
_JWE_REGISTRY = jwe.JWERegistry(algorithms=[_KEY_ALGORITHM, _KEY_ENCRYPTION])


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
# Under a grant, the claims are split: the grant's are those the same for
# every call of the tool under the snapshot, and the call key; the call's
# are those of the call alone, and the grant's jti.
_GRANT_CLAIMS = {
    "iss": "string", "aud": "string", "sub": "string", "iat": "integer", "exp": "integer", "jti": "string",
    "epoch": "string", "tool": "string", "schema_digest": "string", "effect_class": "string",
    "policy_digest": "string", "call_key": "string",
}  # fmt: skip
_CALL_CLAIMS = {
    "grant": "string", "iat": "integer", "exp": "integer", "jti": "string", "args_digest": "string", "rid": "id",
}  # fmt: skip


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


@dataclass(frozen=True)
class _OpenGrant:
    """A grant whose signature verified and whose call key was decrypted."""

    claims: dict[str, Any]
    key: OctKey


class Verifier:
    """Checks envelopes for one server.

    Give exactly one of ``jwks_file``, ``jwks_url`` and ``jwks``. A JWKS
    URL (capsnap's ``GET /.well-known/jwks.json``) is fetched on first use,
    kept for ``refresh`` seconds, and fetched again when an envelope names a
    kid it lacks, at most every ``cooldown`` seconds: that is how a verifier
    follows a key rotation. ``leeway`` is the clock skew allowed at exp, in
    seconds; ``now`` the clock, in seconds since the epoch.

    ``grant_key_files`` are the server's grant keys, P-256 private keys
    (PEM PKCS #8, as ``openssl genpkey -algorithm EC -pkeyopt
    ec_paramgen_curve:P-256`` writes), several during a rotation: a grant's
    call key is decrypted with the one its JWE's ``kid`` names (the key's
    RFC 7638 thumbprint). Without any, a call under a grant is refused and
    only envelopes signed whole are taken. ``max_grants`` bounds the grants
    kept open: past it, those expired are dropped, then the oldest, and a
    grant dropped costs its checks again.

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
        grant_key_files: Sequence[str] = (),
        max_grants: int = MAX_GRANTS,
        refresh: float = 300.0,
        cooldown: float = 1.0,
        leeway: float = 5.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        if not audience:
            raise ValueError("capsnap envelope: a verifier needs its server's id (audience)")
        if sum(x is not None for x in (jwks_file, jwks_url, jwks)) != 1:
            raise ValueError("capsnap envelope: give a verifier exactly one of jwks_file, jwks_url and jwks")
        if isinstance(grant_key_files, (str, bytes)):
            raise TypeError("capsnap envelope: grant_key_files is a list of file names")
        if isinstance(max_grants, bool) or not isinstance(max_grants, int) or max_grants < 1:
            raise ValueError("capsnap envelope: max_grants is a positive integer")
        self.audience = audience
        self.jwks_url = jwks_url
        self._refresh, self._cooldown, self._leeway, self._now = refresh, cooldown, leeway, now
        self._lock = threading.Lock()
        self._keys: dict[str, OKPKey] | None = None
        self._fetched_at = 0.0  # monotonic
        self._seen: dict[str, int] = {}  # jti -> exp, until exp (+ leeway) has passed
        self._pruned = 0.0
        self._grant_keys: dict[str, ECKey] = {}  # kid (RFC 7638 thumbprint) -> private key
        for f in grant_key_files:
            key = _read_grant_key(f)
            self._grant_keys[key.thumbprint()] = key
        self._grants: dict[str, _OpenGrant] = {}  # grant token, exactly as sent -> the grant opened
        self._max_grants = max_grants
        if jwks_file is not None:
            with open(jwks_file, "rb") as f:
                self._keys = _parse_jwks(f.read(), jwks_file)
        elif jwks is not None:
            self._keys = _parse_jwks(json.dumps(jwks).encode(), "jwks")

    def verify(self, token: str | None, call: Call, grant: str | None = None) -> dict[str, Any]:
        """Check ``token`` as the envelope of ``call`` and return its claims.

        ``token`` is the ``x-capsnap-envelope`` header; ``grant`` the
        ``x-capsnap-grant`` header, if the request carries one (``None`` or
        ``""`` if not): then the envelope must be a call's envelope under
        that grant, and the claims returned are the grant's and the call's
        merged, as an envelope signed whole has them (``exp`` the earlier of
        the two, ``jti`` the call's), and ``grant``, the grant's jti.

        A refusal raises :class:`EnvelopeError`. A call refused does not
        use up its envelope: only one that verified in full is remembered.
        """
        if not token:
            raise EnvelopeError(Reason.MISSING, f"the call carries no {HEADER} header")
        if not isinstance(token, str):
            raise EnvelopeError(Reason.INVALID, f"{HEADER} is not one string")
        if grant is None or grant == "":
            c = self._whole(token)
        elif not isinstance(grant, str):
            raise EnvelopeError(Reason.INVALID, f"{GRANT_HEADER} is not one string")
        else:
            c = self._under_grant(grant, token)

        if any(c[k] == "" for k in _REQUIRED) or c["exp"] == 0:
            raise EnvelopeError(Reason.INVALID, "a claim is missing")
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

    def _whole(self, token: str) -> dict[str, Any]:
        """Opens an envelope signed whole, without a grant."""
        return _parse_claims(self._signed(token, TYPE), _CLAIMS)

    def _signed(self, token: str, typ: str) -> bytes:
        """Checks ``token`` as a compact EdDSA JWS of type ``typ`` under a key of the JWKS; its payload."""
        header = _jws_header(token, ALGORITHM, typ)
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            what = "grant" if typ == GRANT_TYPE else "envelope"
            raise EnvelopeError(Reason.INVALID, f"the {what} names no kid")
        key = self._key(kid)
        try:
            return jws.deserialize_compact(token, key, registry=_REGISTRY).payload
        except JoseError as e:
            raise EnvelopeError(Reason.INVALID, f"the signature does not verify under key {kid!r}: {e}") from None
        except (ValueError, TypeError) as e:
            raise EnvelopeError(Reason.INVALID, f"not a compact EdDSA JWS: {e}") from None

    def _under_grant(self, grant_token: str, token: str) -> dict[str, Any]:
        """Opens an envelope under a grant: the grant's signature, its call key, and the envelope's MAC under that key."""
        g = self._open_grant(grant_token)
        gc = g.claims
        header = _jws_header(token, CALL_ALGORITHM, CALL_TYPE, " under the grant")
        if header.get("kid") != gc["jti"]:
            raise EnvelopeError(
                Reason.INVALID, f"the envelope is under grant {header.get('kid')!r}, not the grant sent ({gc['jti']!r})"
            )
        try:
            payload = jws.deserialize_compact(token, g.key, registry=_CALL_REGISTRY).payload
        except (JoseError, ValueError, TypeError):
            raise EnvelopeError(
                Reason.INVALID, f"the envelope's MAC does not verify under grant {gc['jti']!r}'s call key"
            ) from None
        c = _parse_claims(payload, _CALL_CLAIMS)
        if c["grant"] != gc["jti"]:
            raise EnvelopeError(Reason.INVALID, f"the envelope names grant {c['grant']!r}, not {gc['jti']!r}")
        return {
            "iss": gc["iss"], "aud": gc["aud"], "sub": gc["sub"], "iat": c["iat"], "exp": min(c["exp"], gc["exp"]),
            "jti": c["jti"], "epoch": gc["epoch"], "tool": gc["tool"], "schema_digest": gc["schema_digest"],
            "effect_class": gc["effect_class"], "policy_digest": gc["policy_digest"],
            "args_digest": c["args_digest"], "rid": c["rid"], "grant": gc["jti"],
        }  # fmt: skip

    def _open_grant(self, token: str) -> _OpenGrant:
        """Checks a grant's signature and decrypts its call key, once per grant (by its exact token)."""
        with self._lock:
            g = self._grants.get(token)
        if g is not None:
            return g
        gc = _parse_claims(self._signed(token, GRANT_TYPE), _GRANT_CLAIMS)
        if gc["jti"] == "" or gc["call_key"] == "":
            raise EnvelopeError(Reason.INVALID, "a grant claim is missing")
        if gc["iss"] != ISSUER or gc["aud"] != self.audience:
            raise EnvelopeError(
                Reason.FOREIGN, f"a grant issued by {gc['iss']!r} for {gc['aud']!r}; this is {self.audience!r}"
            )
        g = _OpenGrant(claims=gc, key=self._call_key(gc["call_key"]))
        self._keep(token, g)
        return g

    def _call_key(self, value: str) -> OctKey:
        """Decrypts a grant's call key with the grant key its JWE's kid names."""
        parts = value.split(".")
        if len(parts) != 5:
            raise EnvelopeError(Reason.INVALID, "the grant's call key is not a compact JWE")
        try:
            header = _strict_json(_b64url(parts[0]))
        except (ValueError, binascii.Error) as e:
            raise EnvelopeError(Reason.INVALID, f"the grant's call key is not a compact JWE: {e}") from None
        if not isinstance(header, dict) or header.get("alg") != _KEY_ALGORITHM or header.get("enc") != _KEY_ENCRYPTION:
            raise EnvelopeError(
                Reason.INVALID, f"the grant's call key is not a compact {_KEY_ALGORITHM}/{_KEY_ENCRYPTION} JWE"
            )
        kid = header.get("kid")
        key = self._grant_keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise EnvelopeError(
                Reason.INVALID, f"the grant's call key is for grant key {kid!r}, which this server does not hold"
            )
        try:
            plaintext = jwe.decrypt_compact(value, key, registry=_JWE_REGISTRY).plaintext
            if plaintext is None or len(plaintext) != CALL_KEY_SIZE:
                raise ValueError(f"a call key of {len(plaintext or b'')} bytes, want {CALL_KEY_SIZE}")
            return OctKey.import_key(plaintext)
        except (JoseError, ValueError, TypeError, KeyError):
            raise EnvelopeError(
                Reason.INVALID, f"the grant's call key does not decrypt under grant key {kid!r}"
            ) from None

    def _keep(self, token: str, g: _OpenGrant) -> None:
        """Keeps a grant opened until it expires; past max_grants, drops the expired, then the oldest."""
        with self._lock:
            if token not in self._grants and len(self._grants) >= self._max_grants:
                t = self._now()
                for k in [k for k, o in self._grants.items() if t > o.claims["exp"]]:
                    del self._grants[k]
                while len(self._grants) >= self._max_grants:
                    del self._grants[next(iter(self._grants))]
            self._grants[token] = g

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


def _jws_header(token: str, alg: str, typ: str, what: str = "") -> dict[str, Any]:
    """The protected header of ``token``, a compact JWS that must be of ``alg`` and ``typ``."""
    parts = token.split(".")
    if len(parts) != 3:
        raise EnvelopeError(Reason.INVALID, f"not a compact JWS{what}")
    try:
        header = _strict_json(_b64url(parts[0]))
    except (ValueError, binascii.Error) as e:
        raise EnvelopeError(Reason.INVALID, f"not a compact JWS{what}: {e}") from None
    if not isinstance(header, dict):
        raise EnvelopeError(Reason.INVALID, f"not a compact JWS{what}: the header is not an object")
    if header.get("alg") != alg:
        raise EnvelopeError(Reason.INVALID, f"alg {json.dumps(header.get('alg'))}, want {alg}")
    if header.get("typ") != typ:
        raise EnvelopeError(Reason.INVALID, f"typ {json.dumps(header.get('typ'))}, want {typ}")
    return header


def _read_grant_key(file: str) -> ECKey:
    """A server's grant key: a P-256 private key, PEM PKCS #8 ("PRIVATE KEY")."""
    with open(file, "rb") as f:
        data = f.read()
    begin = data.find(b"-----BEGIN ")
    if begin < 0 or not data.startswith(b"-----BEGIN PRIVATE KEY-----", begin):
        raise ValueError(f'capsnap envelope: {file}: want a PEM "PRIVATE KEY" (PKCS #8)')
    try:
        key = ECKey.import_key(data)
    except (JoseError, ValueError, TypeError) as e:
        raise ValueError(f"capsnap envelope: {file}: not a P-256 private key: {e}") from None
    if not key.is_private or key.curve_name != "P-256":
        raise ValueError(f"capsnap envelope: {file}: a {key.curve_name} key, want a P-256 private key")
    return key


def _parse_claims(payload: bytes, spec: Mapping[str, str]) -> dict[str, Any]:
    """The claims of ``payload``: every member ``spec`` names, of its type, and no other."""
    try:
        c = _strict_json(payload)
    except ValueError as e:
        raise EnvelopeError(Reason.INVALID, f"claims: {e}") from None
    if not isinstance(c, dict):
        raise EnvelopeError(Reason.INVALID, "claims: not a JSON object")
    for k in c:
        if k not in spec:
            raise EnvelopeError(Reason.INVALID, f"claims: unknown claim {k!r}")
    for k, kind in spec.items():
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
    return c
