"""Shared by the tests: the Go golden files (envelope/testdata) and a signer
that seals envelopes as capsnap does, with the golden keys."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from joserfc import jws
from joserfc.jwk import OKPKey

from capsnap_envelope import _REGISTRY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TESTDATA = os.path.join(ROOT, "envelope", "testdata")
GOLDEN = open(os.path.join(TESTDATA, "envelope.jws")).read().strip()
GOLDEN_JWKS = os.path.join(TESTDATA, "jwks.json")
GOLDEN_SCHEMA = "sha256:5e177605107699acf71fd66e4e4366fc564025700b218c6f3b3525f4f99833c2"
VECTORS = os.path.join(ROOT, "mcpparse", "testdata", "digest", "vectors.json")
IAT = 1_900_000_000


def at(seconds: float):
    """A clock ``seconds`` after the golden envelope's iat."""
    return lambda: IAT + seconds


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def golden_claims() -> dict[str, Any]:
    part = GOLDEN.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


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
