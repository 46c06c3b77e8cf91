"""Shared by the tests: the Go golden files (envelope/testdata) and a signer
that seals envelopes as capsnap does, with the golden keys: whole, or as a
grant (its call key encrypted to a grant key) and the calls under it."""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from joserfc import jwe, jws
from joserfc.jwk import ECKey, OctKey, OKPKey

from capsnap_envelope import _CALL_REGISTRY, _REGISTRY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TESTDATA = os.path.join(ROOT, "envelope", "testdata")
GOLDEN_JWKS = os.path.join(TESTDATA, "jwks.json")
GOLDEN_SCHEMA = "sha256:5e177605107699acf71fd66e4e4366fc564025700b218c6f3b3525f4f99833c2"
VECTORS = os.path.join(ROOT, "mcpparse", "testdata", "digest", "vectors.json")
IAT = 1_900_000_000


def _read(name: str) -> str:
    with open(os.path.join(TESTDATA, name)) as f:
        return f.read().strip()


GOLDEN = _read("envelope.jws")
GOLDEN_GRANT = _read("grant.jws")
GOLDEN_CALL = _read("call.jws")
# This server's grant key, and another server's.
GRANT_KEY_A = os.path.join(TESTDATA, "grant-key-a.pem")
GRANT_KEY_B = os.path.join(TESTDATA, "grant-key-b.pem")


def at(seconds: float):
    """A clock ``seconds`` after the golden envelope's iat."""
    return lambda: IAT + seconds


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def golden_claims() -> dict[str, Any]:
    return payload(GOLDEN)


def grant_claims() -> dict[str, Any]:
    """The golden grant's claims (exp IAT + 300), but for its call key and with a jti of its own."""
    c = payload(GOLDEN_GRANT)
    del c["call_key"]
    c["jti"] = "grant-" + secrets.token_hex(8)
    return c


def call_claims(jti: str = "call-1") -> dict[str, Any]:
    """The golden call's claims under a grant (exp IAT + 30), with jti; its grant is set when sealed."""
    return {**payload(GOLDEN_CALL), "jti": jti}


def refund_args() -> dict[str, Any]:
    """The golden call's arguments, written another way."""
    return json.loads('{"reason_code":"duplicate_charge", "amount":40.0, "order_id":"A-100"}')


class GoldenKey:
    """key-a.pem or key-b.pem: its public JWK with capsnap's kid (the RFC 7638 thumbprint), and a sealer."""

    def __init__(self, name: str) -> None:
        with open(os.path.join(TESTDATA, name), "rb") as f:
            self.private = OKPKey.import_key(f.read())
        self.kid = self.private.thumbprint()
        pub = self.private.as_dict(private=False)
        self.jwk = {"use": "sig", "kty": "OKP", "kid": self.kid, "crv": "Ed25519", "alg": "EdDSA", "x": pub["x"]}

    def seal(self, claims: dict[str, Any], **header: Any) -> str:
        h = {"alg": "EdDSA", "kid": self.kid, "typ": "capsnap-envelope+jwt", **header}
        h = {k: v for k, v in h.items() if v is not None}
        return jws.serialize_compact(h, json.dumps(claims).encode(), self.private, registry=_REGISTRY)


class GrantRecipient:
    """grant-key-a.pub.pem or grant-key-b.pub.pem: a server's grant key, as capsnap encrypts call keys to it."""

    def __init__(self, name: str) -> None:
        with open(os.path.join(TESTDATA, name), "rb") as f:
            self.public = ECKey.import_key(f.read())
        self.kid = self.public.thumbprint()

    def encrypt(self, plaintext: bytes, algorithms: Collection[str] = ("ECDH-ES", "A256GCM"), **header: Any) -> str:
        h = {"alg": "ECDH-ES", "enc": "A256GCM", "kid": self.kid, **header}
        return jwe.encrypt_compact(h, plaintext, self.public, algorithms=list(algorithms))


@dataclass
class Grant:
    """A grant as capsnap sends it, and its call key, which seals the envelopes of the calls under it."""

    token: str
    claims: dict[str, Any]
    key: bytes

    def seal(self, claims: dict[str, Any], *, edit: Callable[[dict[str, Any]], None] | None = None, **header: Any) -> str:
        """The envelope of one call under the grant: HS256 under the call key, with header and claim edits."""
        c = {**claims, "grant": self.claims["jti"]}
        if edit:
            edit(c)
        h = {"alg": "HS256", "kid": self.claims["jti"], "typ": "capsnap-call+jwt", **header}
        h = {k: v for k, v in h.items() if v is not None}
        registry = _CALL_REGISTRY if h["alg"] == "HS256" else jws.JWSRegistry(algorithms=[h["alg"]])
        return jws.serialize_compact(h, json.dumps(c).encode(), OctKey.import_key(self.key), registry=registry)


def make_grant(
    signer: GoldenKey,
    to: GrantRecipient,
    edit: Callable[[dict[str, Any]], None] | None = None,
    *,
    key: bytes | None = None,
    call_key: str | None = None,
) -> Grant:
    """A grant signed by ``signer``, a fresh call key (or ``key``) encrypted to ``to`` (or ``call_key`` as is)."""
    key = secrets.token_bytes(32) if key is None else key
    c = {**grant_claims(), "call_key": to.encrypt(key) if call_key is None else call_key}
    if edit:
        edit(c)
    return Grant(signer.seal(c, typ="capsnap-grant+jwt"), c, key)
