"""The verifier against the Go golden files: envelope/testdata/envelope.jws,
sealed by envelope_test.go's claims() with key-a.pem, verifies for the golden
call at 1900000005 under jwks.json, and every other envelope or call is
refused with the reason docs/ENVELOPE.md gives."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from capsnap_envelope import Call, EnvelopeError, Reason, Verifier, args_digest, tool_digest  # noqa: E402
from support import (  # noqa: E402
    GOLDEN,
    GOLDEN_JWKS,
    GOLDEN_SCHEMA,
    IAT,
    VECTORS,
    GoldenKey,
    at,
    b64url,
    golden_claims,
    refund_args,
)

A, B = GoldenKey("key-a.pem"), GoldenKey("key-b.pem")
OTHER_ARGS = {"order_id": "A-100", "amount": 400, "reason_code": "duplicate_charge"}


def refund_call(**kw) -> Call:
    return Call(**{"tool": "refund", "arguments": refund_args(), "request_id": 7, **kw})


def verifier(clock=at(5), **kw) -> Verifier:
    return Verifier("billing", jwks_file=GOLDEN_JWKS, now=clock, **kw)


def outcome(v: Verifier, token, call: Call) -> str:
    """The refusal's reason, or '' if token verified for call."""
    try:
        v.verify(token, call)
        return ""
    except EnvelopeError as e:
        return e.reason


def edited(f) -> dict:
    c = golden_claims()
    f(c)
    return c


class GoldenTest(unittest.TestCase):
    def test_golden_key_has_golden_kid(self):
        with open(GOLDEN_JWKS) as f:
            self.assertEqual(A.jwk, json.load(f)["keys"][0])

    def test_golden_envelope_verifies_for_golden_call(self):
        c = verifier().verify(GOLDEN, refund_call(schema_digest=GOLDEN_SCHEMA))
        self.assertEqual(c["tool"], "refund")
        self.assertEqual(c["sub"], "spiffe://acme/agent/support-refund")
        self.assertEqual(c["rid"], 7)
        self.assertEqual(c["args_digest"], args_digest(refund_args()))

    def test_refusals(self):
        claims = golden_claims()
        head, body, sig = GOLDEN.split(".")
        payload = json.dumps(claims)
        raw = __import__("base64").urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        tampered = ".".join([head, b64url(raw.replace('"refund"', '"refunds"').encode()), sig])
        amount400 = ".".join([head, b64url(raw.replace(claims["args_digest"], args_digest(OTHER_ARGS)).encode()), sig])

        # The classic confusions: an HMAC keyed with the public key's bytes, and no signature at all.
        pub = __import__("base64").urlsafe_b64decode(A.jwk["x"] + "=")
        hs_head = b64url(json.dumps({"alg": "HS256", "kid": A.kid, "typ": "capsnap-envelope+jwt"}).encode())
        hs_body = b64url(payload.encode())
        hs_sig = b64url(hmac.new(pub, f"{hs_head}.{hs_body}".encode(), hashlib.sha256).digest())
        hs256 = f"{hs_head}.{hs_body}.{hs_sig}"
        none = ".".join(
            [b64url(json.dumps({"alg": "none", "kid": A.kid, "typ": "capsnap-envelope+jwt"}).encode()), hs_body, ""]
        )
        eddsa_sig_as_hs = ".".join([hs_head, body, sig])

        def set_(k, v):
            return lambda c: c.__setitem__(k, v)

        cases = [
            ("valid", GOLDEN, refund_call(), at(5), ""),
            ("valid with the schema digest", GOLDEN, refund_call(schema_digest=GOLDEN_SCHEMA), at(5), ""),
            ("valid without a request id to compare", GOLDEN, Call("refund", refund_args()), at(5), ""),
            ("valid within the leeway", GOLDEN, refund_call(), at(34), ""),
            ("resealed by capsnap's key", A.seal(claims), refund_call(), at(5), ""),
            ("missing", None, refund_call(), at(5), Reason.MISSING),
            ("empty", "", refund_call(), at(5), Reason.MISSING),
            ("garbled", "not.a.jws", refund_call(), at(5), Reason.INVALID),
            ("two parts", ".".join(GOLDEN.split(".")[:2]), refund_call(), at(5), Reason.INVALID),
            ("payload edited: another tool", tampered, refund_call(tool="refunds"), at(5), Reason.INVALID),
            ("payload edited: the digest of other arguments", amount400, refund_call(arguments=OTHER_ARGS), at(5), Reason.INVALID),
            ("signature cut", GOLDEN[:-4], refund_call(), at(5), Reason.INVALID),
            ("HS256 keyed with the public key", hs256, refund_call(), at(5), Reason.INVALID),
            ("alg HS256 on an EdDSA signature", eddsa_sig_as_hs, refund_call(), at(5), Reason.INVALID),
            ("alg none", none, refund_call(), at(5), Reason.INVALID),
            ("another typ under the same key", A.seal(claims, typ="capsnap-checkpoint+jwt"), refund_call(), at(5), Reason.INVALID),
            ("no typ", A.seal(claims, typ=None), refund_call(), at(5), Reason.INVALID),
            ("no kid", A.seal(claims, kid=None), refund_call(), at(5), Reason.INVALID),
            ("a kid not in the JWKS", A.seal(claims, kid="someone-else"), refund_call(), at(5), Reason.INVALID),
            ("signed by a key not in the JWKS", B.seal(claims), refund_call(), at(5), Reason.INVALID),
            ("signed by another key under capsnap's kid", B.seal(claims, kid=A.kid), refund_call(), at(5), Reason.INVALID),
            ("expired", GOLDEN, refund_call(), at(36), Reason.EXPIRED),
            ("long expired", GOLDEN, refund_call(), at(3600), Reason.EXPIRED),
            ("for another server", A.seal(edited(set_("aud", "payments"))), refund_call(), at(5), Reason.FOREIGN),
            ("from another issuer", A.seal(edited(set_("iss", "someone"))), refund_call(), at(5), Reason.FOREIGN),
            ("another tool", GOLDEN, refund_call(tool="lookup_order"), at(5), Reason.MISMATCH),
            ("other arguments", GOLDEN, refund_call(arguments=OTHER_ARGS), at(5), Reason.MISMATCH),
            ("an argument more", GOLDEN, refund_call(arguments={**refund_args(), "skip_fraud_check": True}), at(5), Reason.MISMATCH),
            ("no arguments", GOLDEN, refund_call(arguments=None), at(5), Reason.MISMATCH),
            ("another request", GOLDEN, refund_call(request_id=8), at(5), Reason.MISMATCH),
            ("the request id as a string", GOLDEN, refund_call(request_id="7"), at(5), Reason.MISMATCH),
            ("another handler definition", GOLDEN, refund_call(schema_digest="sha256:" + "0" * 64), at(5), Reason.HANDLER_DRIFT),
            ("a claim empty", A.seal(edited(set_("schema_digest", ""))), refund_call(), at(5), Reason.INVALID),
            ("a claim absent", A.seal(edited(lambda c: c.pop("jti"))), refund_call(), at(5), Reason.INVALID),
            ("a claim of another type", A.seal(edited(set_("exp", str(IAT + 30)))), refund_call(), at(5), Reason.INVALID),
            ("a claim unknown to the format", A.seal(edited(set_("scope", "admin"))), refund_call(), at(5), Reason.INVALID),
        ]  # fmt: skip
        for name, token, call, clock, want in cases:
            with self.subTest(name):
                self.assertEqual(outcome(verifier(clock), token, call), want)

    def test_golden_envelope_under_another_servers_verifier_is_foreign(self):
        v = Verifier("payments", jwks_file=GOLDEN_JWKS, now=at(5))
        self.assertEqual(outcome(v, GOLDEN, refund_call()), Reason.FOREIGN)

    def test_used_once_and_a_refusal_does_not_use_it_up(self):
        v = verifier()
        other = refund_call(arguments=OTHER_ARGS)
        self.assertEqual(outcome(v, GOLDEN, other), Reason.MISMATCH)
        self.assertEqual(outcome(v, GOLDEN, refund_call()), "")
        self.assertEqual(outcome(v, GOLDEN, refund_call()), Reason.REPLAYED)
        # A replay with other arguments is refused for them, before its jti is looked at.
        self.assertEqual(outcome(v, GOLDEN, other), Reason.MISMATCH)

    def test_replay_memory_forgets_envelopes_past_expiry(self):
        clock = [IAT + 5.0]
        v = Verifier("billing", jwks_file=GOLDEN_JWKS, now=lambda: clock[0])
        for i in range(3):
            c = golden_claims()
            c["jti"], c["iat"] = f"jti-{i}", IAT + i * 100
            c["exp"] = c["iat"] + 30
            clock[0] = c["iat"] + 1
            self.assertEqual(outcome(v, A.seal(c), refund_call()), "")
        self.assertEqual(len(v._seen), 1)

    def test_jwks_without_kids_or_with_private_keys_is_refused_at_start(self):
        d = A.private.as_dict(private=True)["d"]
        for bad in (
            {"keys": [{**A.jwk, "d": d}]},
            {"keys": [{k: v for k, v in A.jwk.items() if k != "kid"}]},
            {"keys": [{"kty": "oct", "kid": "k", "k": "c2VjcmV0"}]},
            {"keys": [A.jwk, A.jwk]},
            {"not": "a set"},
        ):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                Verifier("billing", jwks=bad)
        with self.assertRaises(ValueError):
            Verifier("", jwks_file=GOLDEN_JWKS)
        with self.assertRaises(ValueError):
            Verifier("billing")


class JWKSServer:
    """Serves a JWKS on loopback and counts the fetches."""

    def __init__(self, keys):
        self.published, self.fetches = {"keys": keys}, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.fetches += 1
                body = json.dumps(outer.published).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class RotationTest(unittest.TestCase):
    # Rotation: capsnap publishes the new key before it signs with it; a
    # verifier on the JWKS URL fetches the set again when an envelope names
    # a kid it does not know, at most once a cooldown.
    def test_verifier_on_jwks_url_follows_a_rotation(self):
        srv = JWKSServer([A.jwk])
        self.addCleanup(srv.close)
        v = Verifier("billing", jwks_url=srv.url, now=at(5), cooldown=0.2)

        def seal(k, jti):
            return k.seal({**golden_claims(), "jti": jti})

        self.assertEqual(outcome(v, seal(A, "1"), refund_call()), "")
        srv.published = {"keys": [A.jwk, B.jwk]}  # step 1: the new key is published; the old one still signs
        self.assertEqual(outcome(v, seal(A, "2"), refund_call()), "")
        time.sleep(0.25)  # past the cooldown
        self.assertEqual(outcome(v, seal(B, "3"), refund_call()), "")  # step 2: the new key signs
        self.assertEqual(srv.fetches, 2, "JWKS fetches: the first use and the unknown kid")
        # A kid no set has is refused, and fetches again only after the cooldown.
        self.assertEqual(outcome(v, B.seal({**golden_claims(), "jti": "4"}, kid="unknown"), refund_call()), Reason.INVALID)
        self.assertEqual(outcome(v, B.seal({**golden_claims(), "jti": "5"}, kid="unknown"), refund_call()), Reason.INVALID)
        self.assertLessEqual(srv.fetches, 3)

    def test_jwks_url_that_cannot_be_fetched_refuses(self):
        v = Verifier("billing", jwks_url="http://127.0.0.1:9/jwks.json", now=at(5))
        self.assertEqual(outcome(v, GOLDEN, refund_call()), Reason.INVALID)


class DigestTest(unittest.TestCase):
    # The arguments are bound by their canonical form (envelope_test.go's TestArgsDigest).
    def test_args_digest(self):
        cases = [
            ('{"a":1,"b":"x"}', '{ "b" : "x", "a" : 1.0 }', True),
            ('{"s":"\\u00e9"}', '{"s":"é"}', True),
            (None, "{}", True),
            ("null", "{}", True),
            ('{"amount":40}', '{"amount":41}', False),
            ('{"amount":40}', '{"amount":"40"}', False),
            ('{"a":{"b":[1,2]}}', '{"a":{"b":[2,1]}}', False),
            # JCS reads numbers as doubles, as capsnap does: an int past 2**53 is the double it denotes.
            ('{"n":9007199254740993}', '{"n":9007199254740992}', True),
            ('{"n":1e21}', '{"n":1000000000000000000000}', True),
        ]

        def d(s):
            return args_digest(None if s is None else json.loads(s))

        for x, y, same in cases:
            with self.subTest(x=x, y=y):
                self.assertEqual(d(x) == d(y), same)
        self.assertEqual(args_digest({"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}), golden_claims()["args_digest"])
        with self.assertRaises(ValueError):
            args_digest({"s": "\ud800"})

    # capsnap's schema digest: the published vectors (mcpparse/testdata/digest/vectors.json).
    def test_tool_digest_agrees_with_capsnap_on_every_published_vector(self):
        with open(VECTORS) as f:
            vectors = json.load(f)
        self.assertGreaterEqual(len(vectors), 10)
        for v in vectors:
            with self.subTest(v["name"]):
                self.assertEqual(tool_digest(json.loads(v["definition"])), v["digest"])
        with self.assertRaises(ValueError):
            tool_digest({"description": "no name"})
        with self.assertRaises(ValueError):
            tool_digest({"name": "x", "inputSchema": []})


if __name__ == "__main__":
    unittest.main()
