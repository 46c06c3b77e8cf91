"""Envelopes under a grant (docs/ENVELOPE.md, "Under a grant"), against the
Go golden pair: envelope/testdata/grant.jws, sealed with key-a.pem, its call
key encrypted to grant-key-a.pub.pem, and call.jws under it verify for the
golden call at 1900000005 under jwks.json and grant-key-a.pem. The refusals
are envelope/grant_test.go's TestVerifyUnderAGrant, with grants made here
with joserfc as capsnap makes them (EdDSA with key-a.pem, ECDH-ES/A256GCM to
grant-key-*.pub.pem)."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from joserfc.jwk import ECKey  # noqa: E402

import capsnap_envelope  # noqa: E402
from capsnap_envelope import Call, EnvelopeError, Reason, Verifier  # noqa: E402
from support import (  # noqa: E402
    GOLDEN,
    GOLDEN_CALL,
    GOLDEN_GRANT,
    GOLDEN_JWKS,
    GOLDEN_SCHEMA,
    GRANT_KEY_A,
    GRANT_KEY_B,
    IAT,
    TESTDATA,
    GoldenKey,
    GrantRecipient,
    at,
    b64url,
    call_claims,
    golden_claims,
    make_grant,
    refund_args,
)

A, B = GoldenKey("key-a.pem"), GoldenKey("key-b.pem")
BILLING, PAYMENTS = GrantRecipient("grant-key-a.pub.pem"), GrantRecipient("grant-key-b.pub.pem")
OTHER_ARGS = {"order_id": "A-100", "amount": 400, "reason_code": "duplicate_charge"}


def refund_call(**kw) -> Call:
    return Call(**{"tool": "refund", "arguments": refund_args(), "request_id": 7, **kw})


def verifier(clock=at(5), grant_key_files=(GRANT_KEY_A,), **kw) -> Verifier:
    return Verifier("billing", jwks_file=GOLDEN_JWKS, grant_key_files=list(grant_key_files), now=clock, **kw)


def outcome(v: Verifier, envelope, call: Call, grant=None) -> str:
    """The refusal's reason, or '' if the envelope (under grant) verified for call."""
    try:
        v.verify(envelope, call, grant=grant)
        return ""
    except EnvelopeError as e:
        return e.reason


class GoldenGrantTest(unittest.TestCase):
    def test_golden_pair_verifies_for_golden_call(self):
        c = verifier().verify(GOLDEN_CALL, refund_call(schema_digest=GOLDEN_SCHEMA), grant=GOLDEN_GRANT)
        self.assertEqual(c["grant"], "grant-1")
        self.assertEqual(c["jti"], "call-1")
        self.assertEqual(c["exp"], IAT + 30)  # the call's, the earlier of the two
        self.assertEqual(c["tool"], "refund")
        self.assertEqual(c["sub"], "spiffe://acme/agent/support-refund")
        self.assertEqual(c["rid"], 7)
        self.assertEqual(c["schema_digest"], GOLDEN_SCHEMA)

    def test_golden_pair_with_the_grant_keys_of_a_rotation(self):
        self.assertEqual(outcome(verifier(grant_key_files=(GRANT_KEY_B, GRANT_KEY_A)), GOLDEN_CALL, refund_call(), GOLDEN_GRANT), "")

    def test_golden_pair_at_another_server_is_refused(self):
        # It holds another grant key: the call key is not for it.
        self.assertEqual(outcome(verifier(grant_key_files=(GRANT_KEY_B,)), GOLDEN_CALL, refund_call(), GOLDEN_GRANT), Reason.INVALID)
        # It is another server: the grant is not for it.
        v = Verifier("payments", jwks_file=GOLDEN_JWKS, grant_key_files=[GRANT_KEY_A], now=at(5))
        self.assertEqual(outcome(v, GOLDEN_CALL, refund_call(), GOLDEN_GRANT), Reason.FOREIGN)

    def test_without_a_grant_an_envelope_signed_whole_verifies_as_before(self):
        for grant in (None, ""):
            with self.subTest(grant=grant):
                self.assertEqual(outcome(verifier(), GOLDEN, refund_call(schema_digest=GOLDEN_SCHEMA), grant), "")


class UnderAGrantTest(unittest.TestCase):
    # envelope/grant_test.go's TestVerifyUnderAGrant, and more.
    def test_refusals(self):
        g = make_grant(A, BILLING)
        good = g.seal(call_claims())

        def under(signer=A, to=BILLING, edit=None, **kw):
            h = make_grant(signer, to, edit, **kw)
            return h.seal(call_claims()), h.token

        # Another grant with the same jti: its call key is another.
        twin = make_grant(A, BILLING, lambda c: c.update(jti=g.claims["jti"]))
        wrong_key = twin.seal(call_claims())
        other_grant = make_grant(A, BILLING)
        whole = A.seal({**golden_claims(), "jti": "whole-1"})
        head, body, sig = g.token.split(".")
        raw = __import__("base64").urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        edited = ".".join([head, b64url(raw.replace('"refund"', '"refunds"').encode()), sig])

        def set_(k, v):
            return lambda c: c.__setitem__(k, v)

        def pop(k):
            return lambda c: c.pop(k)

        cases = [
            # name, (envelope, grant), call, clock, grant keys, want
            ("valid", (good, g.token), refund_call(), at(5), (GRANT_KEY_A,), ""),
            ("valid with the schema digest", (good, g.token), refund_call(schema_digest=GOLDEN_SCHEMA), at(5), (GRANT_KEY_A,), ""),
            ("valid without a request id to compare", (good, g.token), Call("refund", refund_args()), at(5), (GRANT_KEY_A,), ""),
            ("valid within the leeway", (good, g.token), refund_call(), at(34), (GRANT_KEY_A,), ""),
            ("expired call", (good, g.token), refund_call(), at(36), (GRANT_KEY_A,), Reason.EXPIRED),
            ("expired grant", under(edit=set_("exp", IAT - 60)), refund_call(), at(5), (GRANT_KEY_A,), Reason.EXPIRED),
            ("other arguments", (good, g.token), refund_call(arguments=OTHER_ARGS), at(5), (GRANT_KEY_A,), Reason.MISMATCH),
            ("another tool", (good, g.token), refund_call(tool="lookup_order"), at(5), (GRANT_KEY_A,), Reason.MISMATCH),
            ("another request", (good, g.token), refund_call(request_id=8), at(5), (GRANT_KEY_A,), Reason.MISMATCH),
            ("another handler definition", (good, g.token), refund_call(schema_digest="sha256:" + "0" * 64), at(5), (GRANT_KEY_A,), Reason.HANDLER_DRIFT),
            ("the grant missing", (good, None), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope missing", (None, g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.MISSING),
            ("under another grant", (good, other_grant.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("MAC'd under another call key", (wrong_key, g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the grant edited", (good, edited), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the grant signed by a key not in the JWKS", under(signer=B), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant for another server", under(edit=set_("aud", "payments")), refund_call(), at(5), (GRANT_KEY_A,), Reason.FOREIGN),
            ("a grant from another issuer", under(edit=set_("iss", "someone")), refund_call(), at(5), (GRANT_KEY_A,), Reason.FOREIGN),
            ("the call key encrypted to another server", under(to=PAYMENTS), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the call key encrypted to another server, under this one's kid",
             under(call_key=PAYMENTS.encrypt(g.key, kid=BILLING.kid)), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant, and no grant key here", (good, g.token), refund_call(), at(5), (), Reason.INVALID),
            ("an envelope signed whole, beside a grant", (whole, g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the grant as the envelope", (g.token, None), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the grant as its own envelope", (g.token, g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("an envelope signed whole as the grant", (good, whole), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant claim empty", under(edit=set_("schema_digest", "")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant claim absent", under(edit=pop("epoch")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant claim unknown to the format", under(edit=set_("scope", "admin")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a grant without a call key", under(edit=set_("call_key", "")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call key that is not a JWE", under(call_key="not.a.jwe"), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call key under another enc", under(call_key=BILLING.encrypt(g.key, ("ECDH-ES", "A128GCM"), enc="A128GCM")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call key wrapped (ECDH-ES+A256KW)", under(call_key=BILLING.encrypt(g.key, ("ECDH-ES+A256KW", "A256GCM"), alg="ECDH-ES+A256KW")), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call key of 16 bytes", under(key=bytes(range(16))), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope under another kid", (g.seal(call_claims(), kid="grant-other"), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope names another grant", (g.seal(call_claims(), edit=set_("grant", "grant-other")), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope of another typ", (g.seal(call_claims(), typ="capsnap-envelope+jwt"), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope without typ", (g.seal(call_claims(), typ=None), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope as HS512", (g.seal(call_claims(), alg="HS512"), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("the envelope's MAC cut", (good[:-4], g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call claim absent", (g.seal(call_claims(), edit=pop("rid")), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call claim unknown to the format", (g.seal(call_claims(), edit=set_("tool", "refund")), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
            ("a call claim empty", (g.seal(call_claims("")), g.token), refund_call(), at(5), (GRANT_KEY_A,), Reason.INVALID),
        ]  # fmt: skip
        for name, (envelope, grant), call, clock, keys, want in cases:
            with self.subTest(name):
                self.assertEqual(outcome(verifier(clock, keys), envelope, call, grant), want)

    def test_merged_claims(self):
        g = make_grant(A, BILLING, lambda c: c.update(exp=IAT + 20))
        c = verifier().verify(g.seal(call_claims()), refund_call(), grant=g.token)
        self.assertEqual(c["exp"], IAT + 20)  # the grant's, the earlier of the two
        self.assertEqual((c["jti"], c["grant"], c["iat"]), ("call-1", g.claims["jti"], IAT))
        self.assertNotIn("call_key", c)
        self.assertEqual(outcome(verifier(at(26)), g.seal(call_claims("call-2")), refund_call(), g.token), Reason.EXPIRED)

    def test_one_grant_serves_many_calls_opened_once_and_a_replay_is_refused(self):
        v = verifier(grant_key_files=(GRANT_KEY_B, GRANT_KEY_A))
        g = make_grant(A, BILLING)
        first, second = g.seal(call_claims("call-1")), g.seal(call_claims("call-2"))
        decrypt = capsnap_envelope.jwe.decrypt_compact
        with mock.patch.object(capsnap_envelope.jwe, "decrypt_compact", wraps=decrypt) as opened:
            self.assertEqual(outcome(v, first, refund_call(), g.token), "")
            self.assertEqual(outcome(v, second, refund_call(), g.token), "")
            self.assertEqual(opened.call_count, 1, "the call key was decrypted more than once")
        self.assertEqual(len(v._grants), 1)
        self.assertEqual(outcome(v, first, refund_call(), g.token), Reason.REPLAYED)
        # An envelope is one call's, under whichever grant: the same jti under another grant is a replay too.
        h = make_grant(A, BILLING)
        self.assertEqual(outcome(v, h.seal(call_claims("call-2")), refund_call(), h.token), Reason.REPLAYED)

    def test_a_refusal_does_not_use_up_the_envelope(self):
        v = verifier()
        g = make_grant(A, BILLING)
        env = g.seal(call_claims())
        self.assertEqual(outcome(v, env, refund_call(arguments=OTHER_ARGS), g.token), Reason.MISMATCH)
        self.assertEqual(outcome(v, env, refund_call(), g.token), "")
        self.assertEqual(outcome(v, env, refund_call(), g.token), Reason.REPLAYED)

    def test_a_grant_opened_is_kept_by_its_exact_token(self):
        v = verifier()
        self.assertEqual(outcome(v, GOLDEN_CALL, refund_call(), GOLDEN_GRANT), "")
        head, body, sig = GOLDEN_GRANT.split(".")
        # The same claims, another signature: not the grant kept, and not capsnap's.
        forged = ".".join([head, body, sig[:-4] + ("AAAA" if not sig.endswith("AAAA") else "BBBB")])
        # Kept by anything but its exact token, the forged grant would be
        # the kept one, and the call under it a replay, not invalid.
        self.assertEqual(outcome(v, GOLDEN_CALL, refund_call(), forged), Reason.INVALID)
        self.assertEqual(len(v._grants), 1)

    def test_grants_kept_are_bounded(self):
        clock = [IAT + 5.0]
        v = verifier(lambda: clock[0], max_grants=2)
        short = make_grant(A, BILLING, lambda c: c.update(exp=IAT + 10))
        grants = [make_grant(A, BILLING) for _ in range(3)]
        self.assertEqual(outcome(v, short.seal(call_claims("c0")), refund_call(), short.token), "")
        self.assertEqual(outcome(v, grants[0].seal(call_claims("c1")), refund_call(), grants[0].token), "")
        clock[0] = IAT + 20  # short has expired: it goes first
        self.assertEqual(outcome(v, grants[1].seal(call_claims("c2")), refund_call(), grants[1].token), "")
        self.assertEqual(list(v._grants), [grants[0].token, grants[1].token])
        # None has expired: the oldest goes.
        self.assertEqual(outcome(v, grants[2].seal(call_claims("c3")), refund_call(), grants[2].token), "")
        self.assertEqual(list(v._grants), [grants[1].token, grants[2].token])
        # A grant dropped is opened again.
        self.assertEqual(outcome(v, grants[0].seal(call_claims("c4")), refund_call(), grants[0].token), "")

    def test_max_grants_is_a_positive_integer(self):
        self.assertEqual(capsnap_envelope.MAX_GRANTS, 4096)
        self.assertEqual(verifier()._max_grants, capsnap_envelope.MAX_GRANTS)
        for bad in (0, -1, 1.5, True, "2"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                verifier(max_grants=bad)

    def test_grant_keys_that_are_not_p256_private_keys_are_refused_at_start(self):
        td = tempfile.TemporaryDirectory()
        self.addCleanup(td.cleanup)
        tmp = td.name
        p384 = os.path.join(tmp, "p384.pem")
        with open(p384, "wb") as f:
            f.write(ECKey.generate_key("P-384").as_pem(private=True))
        for bad in (
            os.path.join(TESTDATA, "grant-key-a.pub.pem"),  # the public half
            os.path.join(TESTDATA, "key-a.pem"),  # an Ed25519 key
            GOLDEN_JWKS,  # not PEM
            p384,
        ):
            with self.subTest(bad=os.path.basename(bad)), self.assertRaises(ValueError):
                verifier(grant_key_files=(bad,))
        with self.assertRaises(OSError):
            verifier(grant_key_files=(os.path.join(tmp, "absent.pem"),))
        with self.assertRaises(TypeError):
            Verifier("billing", jwks_file=GOLDEN_JWKS, grant_key_files=GRANT_KEY_A)


if __name__ == "__main__":
    unittest.main()
