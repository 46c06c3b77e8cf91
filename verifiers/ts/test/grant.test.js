// Envelopes under a grant (docs/ENVELOPE.md, "Under a grant"), against the
// Go golden pair (envelope/testdata/grant.jws and call.jws verify for the
// golden call at 1900000005 under jwks.json and grant-key-a.pem) and
// against grants made here as envelope/grant.go makes them; the refusals
// are envelope/grant_test.go's TestVerifyUnderAGrant, and more.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { CompactSign, base64url, decodeProtectedHeader } from 'jose';
import { MAX_GRANTS, createVerifier, EnvelopeError, Reason } from '../src/envelope.js';
import {
  IAT, at, callClaims, golden, goldenCall, goldenGrant, goldenJWKS, goldenKey, grantRecipient, makeGrant, refundCall,
  testdata,
} from './helpers.js';

const GOLDEN_SCHEMA = 'sha256:5e177605107699acf71fd66e4e4366fc564025700b218c6f3b3525f4f99833c2';
const grantKeyA = testdata + 'grant-key-a.pem';
const grantKeyB = testdata + 'grant-key-b.pem';

/** A verifier for billing under the golden JWKS, taking grants to grant-key-a unless told otherwise. */
const verifier = (clock = at(0), o = {}) => createVerifier({
  audience: 'billing', jwksFile: goldenJWKS, grantKeyFiles: [grantKeyA], now: clock, ...o,
});

/** Resolves to the refusal's reason, or '' if what was presented verified for call. */
async function outcome(v, presented, call) {
  try {
    await v.verify(presented, call);
    return '';
  } catch (e) {
    if (!(e instanceof EnvelopeError)) throw e;
    return e.reason;
  }
}

/**
 * Counts what the Web Crypto API is asked to do while f runs: Ed25519
 * verifications (a grant's signature, or an envelope signed whole), ECDH
 * derivations (a grant's call key) and HMAC verifications (a call's MAC).
 */
async function counting(f) {
  const subtle = globalThis.crypto.subtle;
  const n = { ed25519: 0, ecdh: 0, hmac: 0 };
  const verify = subtle.verify, deriveBits = subtle.deriveBits;
  subtle.verify = function (alg, ...rest) {
    const name = typeof alg === 'string' ? alg : alg?.name;
    if (name === 'Ed25519') n.ed25519++;
    if (name === 'HMAC') n.hmac++;
    return verify.call(this, alg, ...rest);
  };
  subtle.deriveBits = function (alg, ...rest) {
    if (alg?.name === 'ECDH') n.ecdh++;
    return deriveBits.call(this, alg, ...rest);
  };
  try {
    await f();
  } finally {
    delete subtle.verify;
    delete subtle.deriveBits;
  }
  return n;
}

test('the golden grant and the envelope under it verify for the golden call', async () => {
  const c = await verifier(at(5)).verify({ envelope: goldenCall, grant: goldenGrant }, { ...refundCall(), schemaDigest: GOLDEN_SCHEMA });
  assert.equal(c.grant, 'grant-1');
  assert.equal(c.jti, 'call-1');
  assert.equal(c.exp, IAT + 30, 'the earlier of the call\'s exp and the grant\'s');
  assert.equal(c.tool, 'refund');
  assert.equal(c.sub, 'spiffe://acme/agent/support-refund');
  assert.equal(c.rid, 7);
  assert.equal(c.iss, 'capsnap');
  assert.equal(c.aud, 'billing');
});

test('the golden grant\'s call key is to grant-key-a, by its RFC 7638 thumbprint', async () => {
  const a = await grantRecipient('grant-key-a.pub.pem');
  const callKey = JSON.parse(Buffer.from(goldenGrant.split('.')[1], 'base64url').toString('utf8')).call_key;
  const h = decodeProtectedHeader(callKey);
  assert.deepEqual([h.alg, h.enc, h.kid], ['ECDH-ES', 'A256GCM', a.kid]);
});

test('the golden pair: another server\'s grant key, or none, or another server, refuses', async () => {
  const presented = { envelope: goldenCall, grant: goldenGrant };
  // During a rotation, a verifier holds both and picks by kid.
  assert.equal(await outcome(verifier(at(5), { grantKeyFiles: [grantKeyB, grantKeyA] }), presented, refundCall()), '');
  assert.equal(await outcome(verifier(at(5), { grantKeyFiles: [grantKeyB] }), presented, refundCall()), Reason.Invalid);
  assert.equal(await outcome(verifier(at(5), { grantKeyFiles: [] }), presented, refundCall()), Reason.Invalid);
  assert.equal(await outcome(verifier(at(5), { grantKeyFiles: undefined }), presented, refundCall()), Reason.Invalid);
  assert.equal(await outcome(verifier(at(5), { audience: 'payments' }), presented, refundCall()), Reason.Foreign);
  assert.equal(await outcome(verifier(at(36)), presented, refundCall()), Reason.Expired);
  // The call's envelope alone is no envelope signed whole.
  assert.equal(await outcome(verifier(at(5)), goldenCall, refundCall()), Reason.Invalid);
});

// envelope/grant_test.go's TestVerifyUnderAGrant, case for case, then more.
test('refusals under a grant', async () => {
  const a = await goldenKey('key-a.pem');
  const other = await goldenKey('key-b.pem');
  const billing = await grantRecipient('grant-key-a.pub.pem');
  const payments = await grantRecipient('grant-key-b.pub.pem');
  const g = await makeGrant(a, billing);
  const good = await g.seal(callClaims('call-1'));
  // A grant whose call key (key) is encrypted to r with the JWE header edited, and a call under it.
  const withCallKey = async (key, r, jweHeader = {}) => {
    const jwe = await r.encrypt(key, jweHeader);
    const h = await makeGrant(a, billing, c => { c.call_key = jwe; }, { callKey: key });
    return { envelope: await h.seal(callClaims('call-1')), grant: h.token };
  };
  const under = async (k, r, edit, o) => {
    const h = await makeGrant(k, r, edit, o);
    return { envelope: await h.seal(callClaims('call-1')), grant: h.token };
  };
  // Another grant with the same jti: its call key is another.
  const twin = await makeGrant(a, billing, c => { c.jti = g.claims.jti; });
  const wrongKey = await twin.seal(callClaims('call-1'));
  const otherGrant = await makeGrant(a, billing);
  const edited = g.token.split('.');
  edited[1] = base64url.encode(Buffer.from(edited[1], 'base64url').toString('utf8').replace('"refund"', '"refunds"'));

  const call = refundCall();
  const otherArgs = { order_id: 'A-100', amount: 400, reason_code: 'duplicate_charge' };
  const P = (envelope, grant) => ({ envelope, grant });
  const noKeys = { grantKeyFiles: [] };
  const cases = [
    ['valid', P(good, g.token), call, at(0), {}, ''],
    ['valid within the leeway', P(good, g.token), call, at(34), {}, ''],
    ['expired call', P(good, g.token), call, at(36), {}, Reason.Expired],
    ['expired grant', await under(a, billing, c => { c.exp = IAT - 60; }), call, at(0), {}, Reason.Expired],
    ['other arguments', P(good, g.token), { ...call, arguments: otherArgs }, at(0), {}, Reason.Mismatch],
    ['another tool', P(good, g.token), { ...call, tool: 'lookup_order' }, at(0), {}, Reason.Mismatch],
    ['another request', P(good, g.token), { ...call, requestId: 8 }, at(0), {}, Reason.Mismatch],
    ['the grant missing', P(good, ''), call, at(0), {}, Reason.Invalid],
    ['the envelope missing', P('', g.token), call, at(0), {}, Reason.Missing],
    ['under another grant', P(good, otherGrant.token), call, at(0), {}, Reason.Invalid],
    ['MAC\'d under another call key', P(wrongKey, g.token), call, at(0), {}, Reason.Invalid],
    ['the grant edited', P(good, edited.join('.')), call, at(0), {}, Reason.Invalid],
    ['the grant signed by a key not in the JWKS', await under(other, billing), call, at(0), {}, Reason.Invalid],
    ['a grant for another server', await under(a, billing, c => { c.aud = 'payments'; }), call, at(0), {}, Reason.Foreign],
    ['the call key encrypted to another server', await under(a, payments), call, at(0), {}, Reason.Invalid],
    ['a grant, and no grant key here', P(good, g.token), call, at(0), noKeys, Reason.Invalid],
    ['an envelope signed whole, beside a grant', P(golden, g.token), call, at(0), {}, Reason.Invalid],
    ['the grant as the envelope', P(g.token, ''), call, at(0), {}, Reason.Invalid],
    ['the grant as its own envelope', P(g.token, g.token), call, at(0), {}, Reason.Invalid],
    ['a grant claim missing', await under(a, billing, c => { c.schema_digest = ''; }), call, at(0), {}, Reason.Invalid],

    // Beyond Go's table.
    ['the grant missing, the envelope alone as a string', good, call, at(0), {}, Reason.Invalid],
    ['the grant missing, undefined', P(good, undefined), call, at(0), {}, Reason.Invalid],
    ['the envelope undefined', P(undefined, g.token), call, at(0), {}, Reason.Missing],
    ['the grant header not one string', P(good, [g.token, g.token]), call, at(0), {}, Reason.Invalid],
    ['the grant garbled', P(good, 'not.a.jws'), call, at(0), {}, Reason.Invalid],
    ['an envelope signed whole as the grant', P(good, golden), call, at(0), {}, Reason.Invalid],
    ['the expired grant within the leeway', await under(a, billing, c => { c.exp = IAT + 10; }), call, at(14), {}, ''],
    ['the grant expires before the call', await under(a, billing, c => { c.exp = IAT + 10; }), call, at(16), {}, Reason.Expired],
    ['another handler definition', P(good, g.token), { ...call, schemaDigest: 'sha256:' + '0'.repeat(64) }, at(0), {}, Reason.HandlerDrift],
    ['the handler\'s own definition', P(good, g.token), { ...call, schemaDigest: GOLDEN_SCHEMA }, at(0), {}, ''],
    ['a grant from another issuer', await under(a, billing, c => { c.iss = 'someone'; }), call, at(0), {}, Reason.Foreign],
    ['a grant under a kid not in the JWKS', await under(a, billing, undefined, { header: { kid: 'someone-else' } }), call, at(0), {}, Reason.Invalid],
    ['a grant naming no kid', await under(a, billing, undefined, { header: { kid: undefined } }), call, at(0), {}, Reason.Invalid],
    ['a grant of another typ', await under(a, billing, undefined, { header: { typ: 'capsnap-envelope+jwt' } }), call, at(0), {}, Reason.Invalid],
    ['a grant claim unknown to the format', await under(a, billing, c => { c.scope = 'admin'; }), call, at(0), {}, Reason.Invalid],
    ['a grant claim of another type', await under(a, billing, c => { c.exp = String(c.exp); }), call, at(0), {}, Reason.Invalid],
    ['a grant without a jti', await under(a, billing, c => { c.jti = ''; }), call, at(0), {}, Reason.Invalid],
    ['a grant without a call key', await under(a, billing, c => { delete c.call_key; }), call, at(0), {}, Reason.Invalid],
    ['a grant\'s call key empty', await under(a, billing, c => { c.call_key = ''; }), call, at(0), {}, Reason.Invalid],
    ['a call key that is no JWE', await under(a, billing, c => { c.call_key = 'a.b.c'; }), call, at(0), {}, Reason.Invalid],
    ['a call key wrapped (ECDH-ES+A256KW)', await withCallKey(randomBytes(32), billing, { alg: 'ECDH-ES+A256KW' }), call, at(0), {}, Reason.Invalid],
    ['a call key under A128GCM', await withCallKey(randomBytes(32), billing, { enc: 'A128GCM' }), call, at(0), {}, Reason.Invalid],
    ['a call key of 16 bytes', await withCallKey(randomBytes(16), billing), call, at(0), {}, Reason.Invalid],
    ['a call key naming no grant key', await withCallKey(randomBytes(32), billing, { kid: undefined }), call, at(0), {}, Reason.Invalid],
    ['a call key to another server under this server\'s kid', await withCallKey(randomBytes(32), payments, { kid: billing.kid }), call, at(0), {}, Reason.Invalid],
    ['a call key as direct encryption (dir)', P(good, (await makeGrant(a, billing, c => { c.call_key = g.claims.call_key.replace(/^[^.]+/, base64url.encode(JSON.stringify({ alg: 'dir', enc: 'A256GCM', kid: billing.kid }))); })).token), call, at(0), {}, Reason.Invalid],
    ['the envelope MAC\'d with HS512', P(await g.seal(callClaims('call-1'), { alg: 'HS512' }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope signed with EdDSA as a call', P(await a.seal({ grant: g.claims.jti, ...callClaims('call-1') }, { typ: 'capsnap-call+jwt' }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope of another typ', P(await g.seal(callClaims('call-1'), { typ: 'capsnap-envelope+jwt' }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope under another grant\'s kid', P(await g.seal(callClaims('call-1'), { kid: otherGrant.claims.jti }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope naming no kid', P(await g.seal(callClaims('call-1'), { kid: undefined }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope naming another grant', P(await g.seal({ ...callClaims('call-1'), grant: otherGrant.claims.jti }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope MAC cut', P(good.slice(0, -4), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope with a claim more (tool)', P(await g.seal({ ...callClaims('call-1'), tool: 'refund' }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope without rid', P(await g.seal((({ rid, ...c }) => c)(callClaims('call-1'))), g.token), call, at(0), {}, Reason.Invalid], // eslint-disable-line no-unused-vars
    ['the envelope with an empty jti', P(await g.seal(callClaims('')), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope with exp 0', P(await g.seal({ ...callClaims('call-1'), exp: 0 }), g.token), call, at(0), {}, Reason.Invalid],
    ['the envelope with an empty args_digest', P(await g.seal({ ...callClaims('call-1'), args_digest: '' }), g.token), call, at(0), {}, Reason.Invalid],
    ['alg none under the grant', P([base64url.encode(JSON.stringify({ alg: 'none', kid: g.claims.jti, typ: 'capsnap-call+jwt' })), good.split('.')[1], ''].join('.'), g.token), call, at(0), {}, Reason.Invalid],
  ];
  for (const [name, presented, c, clock, o, want] of cases) {
    assert.equal(await outcome(verifier(clock, o), presented, c), want, name);
  }
  // Merged claims, as Go's test checks them.
  const c = await verifier().verify(P(good, g.token), call);
  assert.deepEqual(
    [c.tool, c.sub, c.grant, c.jti, c.exp, c.iat, c.epoch, c.effect_class, c.policy_digest, c.schema_digest],
    ['refund', 'spiffe://acme/agent/support-refund', g.claims.jti, 'call-1', IAT + 30, IAT, g.claims.epoch, g.claims.effect_class, g.claims.policy_digest, GOLDEN_SCHEMA],
  );
});

// envelope/grant_test.go's TestGrantServesManyCallsOnce.
test('one grant serves many calls, opened once; an envelope used twice is a replay', async () => {
  const a = await goldenKey('key-a.pem');
  const g = await makeGrant(a, await grantRecipient('grant-key-a.pub.pem'));
  const v = verifier(at(0), { grantKeyFiles: [grantKeyB, grantKeyA] });
  const first = await g.seal(callClaims());
  const second = await g.seal(callClaims());
  const n = await counting(async () => {
    assert.equal(await outcome(v, { envelope: first, grant: g.token }, refundCall()), '', 'first call');
    assert.equal(await outcome(v, { envelope: second, grant: g.token }, refundCall()), '', 'second call');
    assert.equal(await outcome(v, { envelope: first, grant: g.token }, refundCall()), Reason.Replayed, 'the first envelope again');
  });
  assert.deepEqual(n, { ed25519: 1, ecdh: 1, hmac: 3 }, 'the grant is verified and its call key decrypted once; each call is one HMAC');
});

test('a grant refused is not kept: presented again, it is checked again', async () => {
  const a = await goldenKey('key-a.pem');
  const g = await makeGrant(a, await grantRecipient('grant-key-b.pub.pem'));
  const v = verifier();
  const n = await counting(async () => {
    for (let i = 0; i < 2; i++) {
      assert.equal(await outcome(v, { envelope: await g.seal(callClaims()), grant: g.token }, refundCall()), Reason.Invalid);
    }
  });
  assert.equal(n.ed25519, 2);
});

test('a refused call does not use up its envelope under a grant', async () => {
  const a = await goldenKey('key-a.pem');
  const g = await makeGrant(a, await grantRecipient('grant-key-a.pub.pem'));
  const v = verifier();
  const p = { envelope: await g.seal(callClaims()), grant: g.token };
  assert.equal(await outcome(v, p, { ...refundCall(), requestId: 8 }), Reason.Mismatch);
  assert.equal(await outcome(v, p, refundCall()), '');
  assert.equal(await outcome(v, p, refundCall()), Reason.Replayed);
});

test('the grants kept are bounded: past maxGrants those expired go first, then the oldest', async () => {
  const a = await goldenKey('key-a.pem');
  const billing = await grantRecipient('grant-key-a.pub.pem');
  let clock = at(5)();
  const v = verifier(() => clock, { maxGrants: 2 });
  const short = await makeGrant(a, billing, c => { c.exp = IAT + 10; });
  const grants = [await makeGrant(a, billing), await makeGrant(a, billing), await makeGrant(a, billing)];
  /** How many grants verifying a call under g opened: 0 if it was kept, 1 if not. */
  const opened = async g => (await counting(async () => {
    assert.equal(await outcome(v, { envelope: await g.seal(callClaims()), grant: g.token }, refundCall()), '');
  })).ecdh;
  assert.equal(await opened(short), 1);
  assert.equal(await opened(grants[0]), 1);
  clock = at(20)(); // short has expired: it goes first
  assert.equal(await opened(grants[1]), 1);
  assert.equal(await opened(grants[0]), 0, 'grants[0] was kept');
  // None has expired: the oldest goes.
  assert.equal(await opened(grants[2]), 1);
  assert.equal(await opened(grants[1]), 0, 'grants[1] was kept');
  assert.equal(await opened(grants[0]), 1, 'grants[0], the oldest, was dropped, and is opened again');
  assert.equal(MAX_GRANTS, 4096);
});

test('grantKeyFiles: P-256 private keys, PEM PKCS #8, and nothing else', () => {
  assert.throws(() => verifier(at(0), { grantKeyFiles: grantKeyA }), /array of file names/);
  assert.throws(() => verifier(at(0), { grantKeyFiles: [testdata + 'grant-key-a.pub.pem'] }), /PRIVATE KEY/);
  assert.throws(() => verifier(at(0), { grantKeyFiles: [testdata + 'key-a.pem'] }), /want a P-256 private key/);
  assert.throws(() => verifier(at(0), { grantKeyFiles: [testdata + 'no-such-key.pem'] }), /ENOENT/);
  assert.throws(() => verifier(at(0), { maxGrants: 0 }), /maxGrants/);
});

test('an envelope signed whole is checked as before beside grant keys', async () => {
  assert.equal(await outcome(verifier(at(5)), golden, refundCall()), '');
  assert.equal(await outcome(verifier(at(5)), { envelope: golden }, refundCall()), '');
  assert.equal(await outcome(verifier(at(5)), { envelope: golden, grant: '' }, refundCall()), '');
  const c = await verifier(at(5)).verify({ envelope: golden, grant: null }, refundCall());
  assert.equal(c.grant, undefined);
  // An HS256 envelope without its grant is refused as alg confusion is.
  const a = await goldenKey('key-a.pem');
  const hs = await new CompactSign(new TextEncoder().encode('{}')).setProtectedHeader({ alg: 'HS256', typ: 'capsnap-envelope+jwt', kid: a.kid }).sign(randomBytes(32));
  assert.equal(await outcome(verifier(at(5)), hs, refundCall()), Reason.Invalid);
});
