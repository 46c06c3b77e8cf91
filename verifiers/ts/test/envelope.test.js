// The verifier against the Go golden files: envelope/testdata/envelope.jws,
// sealed by envelope_test.go's claims() with key-a.pem, verifies for the
// golden call at 1900000005 under jwks.json, and every other envelope or
// call is refused with the reason docs/ENVELOPE.md gives.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { CompactSign, base64url } from 'jose';
import { argsDigest, createVerifier, EnvelopeError, Reason, toolDigest } from '../src/envelope.js';
import { IAT, at, golden, goldenClaims, goldenJWKS, goldenKey, refundCall, testdata } from './helpers.js';

const GOLDEN_SCHEMA = 'sha256:5e177605107699acf71fd66e4e4366fc564025700b218c6f3b3525f4f99833c2';

const verifier = (clock = at(5), o = {}) => createVerifier({ audience: 'billing', jwksFile: goldenJWKS, now: clock, ...o });

/** Resolves to the refusal's reason, or '' if token verified for call. */
async function outcome(v, token, call) {
  try {
    await v.verify(token, call);
    return '';
  } catch (e) {
    if (!(e instanceof EnvelopeError)) throw e;
    return e.reason;
  }
}

test('the golden key has the golden kid', async () => {
  const a = await goldenKey('key-a.pem');
  const jwks = JSON.parse(readFileSync(goldenJWKS, 'utf8'));
  assert.deepEqual(a.jwk, jwks.keys[0]);
});

test('the golden envelope verifies for the golden call', async () => {
  const c = await verifier().verify(golden, { ...refundCall(), schemaDigest: GOLDEN_SCHEMA });
  assert.equal(c.tool, 'refund');
  assert.equal(c.sub, 'spiffe://acme/agent/support-refund');
  assert.equal(c.rid, 7);
  assert.equal(c.args_digest, argsDigest(refundCall().arguments));
});

test('refusals', async () => {
  const a = await goldenKey('key-a.pem');
  const b = await goldenKey('key-b.pem');
  const claims = goldenClaims();
  const edit = f => { const c = goldenClaims(); f(c); return c; };
  const [head, , sig] = golden.split('.');
  const payload = Buffer.from(golden.split('.')[1], 'base64url').toString('utf8');
  const tampered = [head, base64url.encode(payload.replace('"refund"', '"refunds"')), sig].join('.');
  const amount400 = [head, base64url.encode(payload.replace(claims.args_digest, argsDigest({ order_id: 'A-100', amount: 400, reason_code: 'duplicate_charge' }))), sig].join('.');
  // The classic confusions: an HMAC keyed with the public key's bytes, and no signature at all.
  const pub = base64url.decode(a.jwk.x);
  const hs256 = await new CompactSign(new TextEncoder().encode(payload))
    .setProtectedHeader({ alg: 'HS256', kid: a.kid, typ: 'capsnap-envelope+jwt' }).sign(pub);
  const none = [base64url.encode(JSON.stringify({ alg: 'none', kid: a.kid, typ: 'capsnap-envelope+jwt' })), base64url.encode(payload), ''].join('.');
  const eddsaClaimsAsHS = [base64url.encode(JSON.stringify({ alg: 'HS256', kid: a.kid, typ: 'capsnap-envelope+jwt' })), base64url.encode(payload), sig].join('.');
  const call = refundCall();
  const cases = [
    ['valid', golden, call, at(5), ''],
    ['valid with the schema digest', golden, { ...call, schemaDigest: GOLDEN_SCHEMA }, at(5), ''],
    ['valid without a request id to compare', golden, { tool: call.tool, arguments: call.arguments }, at(5), ''],
    ['valid within the leeway', golden, call, at(34), ''],
    ['resealed by capsnap\'s key', await a.seal(claims), call, at(5), ''],
    ['missing', undefined, call, at(5), Reason.Missing],
    ['empty', '', call, at(5), Reason.Missing],
    ['garbled', 'not.a.jws', call, at(5), Reason.Invalid],
    ['two parts', golden.split('.').slice(0, 2).join('.'), call, at(5), Reason.Invalid],
    ['payload edited: another tool', tampered, { ...call, tool: 'refunds' }, at(5), Reason.Invalid],
    ['payload edited: the digest of other arguments', amount400, { ...call, arguments: { order_id: 'A-100', amount: 400, reason_code: 'duplicate_charge' } }, at(5), Reason.Invalid],
    ['signature cut', golden.slice(0, -4), call, at(5), Reason.Invalid],
    ['HS256 keyed with the public key', hs256, call, at(5), Reason.Invalid],
    ['alg HS256 on an EdDSA signature', eddsaClaimsAsHS, call, at(5), Reason.Invalid],
    ['alg none', none, call, at(5), Reason.Invalid],
    ['another typ under the same key', await a.seal(claims, { typ: 'capsnap-checkpoint+jwt' }), call, at(5), Reason.Invalid],
    ['no typ', await a.seal(claims, { typ: undefined }), call, at(5), Reason.Invalid],
    ['no kid', await a.seal(claims, { kid: undefined }), call, at(5), Reason.Invalid],
    ['a kid not in the JWKS', await a.seal(claims, { kid: 'someone-else' }), call, at(5), Reason.Invalid],
    ['signed by a key not in the JWKS', await b.seal(claims), call, at(5), Reason.Invalid],
    ['signed by another key under capsnap\'s kid', await b.seal(claims, { kid: a.kid }), call, at(5), Reason.Invalid],
    ['expired', golden, call, at(36), Reason.Expired],
    ['long expired', golden, call, at(3600), Reason.Expired],
    ['for another server', await a.seal(edit(c => { c.aud = 'payments'; })), call, at(5), Reason.Foreign],
    ['from another issuer', await a.seal(edit(c => { c.iss = 'someone'; })), call, at(5), Reason.Foreign],
    ['another tool', golden, { ...call, tool: 'lookup_order' }, at(5), Reason.Mismatch],
    ['other arguments', golden, { ...call, arguments: { order_id: 'A-100', amount: 400, reason_code: 'duplicate_charge' } }, at(5), Reason.Mismatch],
    ['an argument more', golden, { ...call, arguments: { ...call.arguments, skip_fraud_check: true } }, at(5), Reason.Mismatch],
    ['no arguments', golden, { ...call, arguments: undefined }, at(5), Reason.Mismatch],
    ['another request', golden, { ...call, requestId: 8 }, at(5), Reason.Mismatch],
    ['the request id as a string', golden, { ...call, requestId: '7' }, at(5), Reason.Mismatch],
    ['another handler definition', golden, { ...call, schemaDigest: 'sha256:' + '0'.repeat(64) }, at(5), Reason.HandlerDrift],
    ['a claim empty', await a.seal(edit(c => { c.schema_digest = ''; })), call, at(5), Reason.Invalid],
    ['a claim absent', await a.seal(edit(c => { delete c.jti; })), call, at(5), Reason.Invalid],
    ['a claim of another type', await a.seal(edit(c => { c.exp = String(c.exp); })), call, at(5), Reason.Invalid],
    ['a claim unknown to the format', await a.seal(edit(c => { c.scope = 'admin'; })), call, at(5), Reason.Invalid],
  ];
  for (const [name, token, c, clock, want] of cases) {
    assert.equal(await outcome(verifier(clock), token, c), want, name);
  }
});

test('the golden envelope under another server\'s verifier is foreign', async () => {
  const v = createVerifier({ audience: 'payments', jwksFile: goldenJWKS, now: at(5) });
  assert.equal(await outcome(v, golden, refundCall()), Reason.Foreign);
});

test('an envelope is used once; a refused call does not use it up', async () => {
  const v = verifier();
  const other = { ...refundCall(), arguments: { order_id: 'A-100', amount: 400, reason_code: 'duplicate_charge' } };
  assert.equal(await outcome(v, golden, other), Reason.Mismatch);
  assert.equal(await outcome(v, golden, refundCall()), '');
  assert.equal(await outcome(v, golden, refundCall()), Reason.Replayed);
  // A replay with other arguments is refused for them, before its jti is looked at.
  assert.equal(await outcome(v, golden, other), Reason.Mismatch);
});

test('the replay memory forgets envelopes past their expiry', async () => {
  let clock = at(5)();
  const a = await goldenKey('key-a.pem');
  const v = createVerifier({ audience: 'billing', jwksFile: goldenJWKS, now: () => clock });
  for (let i = 0; i < 3; i++) {
    const c = goldenClaims();
    c.jti = `jti-${i}`;
    c.iat = IAT + i * 100; c.exp = c.iat + 30;
    clock = (c.iat + 1) * 1000;
    assert.equal(await outcome(v, await a.seal(c), refundCall()), '');
  }
});

// Rotation: capsnap publishes the new key before it signs with it; a
// verifier on the JWKS URL fetches the set again when an envelope names a
// kid it does not know.
test('a verifier on the JWKS URL follows a key rotation', async () => {
  const a = await goldenKey('key-a.pem');
  const b = await goldenKey('key-b.pem');
  let published = { keys: [a.jwk] };
  let fetches = 0;
  const srv = createServer((_, res) => {
    fetches++;
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify(published));
  });
  await new Promise(r => srv.listen(0, '127.0.0.1', r));
  try {
    const url = `http://127.0.0.1:${srv.address().port}/.well-known/jwks.json`;
    const v = createVerifier({ audience: 'billing', jwksUrl: url, now: at(5), cooldown: 200 });
    const seal = async (k, jti) => k.seal({ ...goldenClaims(), jti });
    assert.equal(await outcome(v, await seal(a, '1'), refundCall()), '');
    published = { keys: [a.jwk, b.jwk] }; // step 1: the new key is published; the old one still signs
    assert.equal(await outcome(v, await seal(a, '2'), refundCall()), '');
    await new Promise(r => setTimeout(r, 250)); // past the cooldown
    // step 2: the new key signs
    assert.equal(await outcome(v, await seal(b, '3'), refundCall()), '');
    assert.equal(fetches, 2, 'JWKS fetches: the first use and the unknown kid');
    // A kid no set has is refused, and fetches again only after the cooldown.
    const stranger = { ...b, seal: (c) => b.seal(c, { kid: 'unknown' }) };
    assert.equal(await outcome(v, await seal(stranger, '4'), refundCall()), Reason.Invalid);
    assert.equal(await outcome(v, await seal(stranger, '5'), refundCall()), Reason.Invalid);
    assert.ok(fetches <= 3, `${fetches} fetches for two envelopes of an unknown kid within the cooldown`);
  } finally {
    srv.close();
  }
});

test('a JWKS URL that cannot be fetched refuses, never fails open', async () => {
  const v = createVerifier({ audience: 'billing', jwksUrl: 'http://127.0.0.1:9/jwks.json', now: at(5) });
  assert.equal(await outcome(v, golden, refundCall()), Reason.Invalid);
});

test('a JWKS with a private key, or without kids, is refused at start', async () => {
  const a = await goldenKey('key-a.pem');
  const { d } = await import('jose').then(j => j.exportJWK(a.priv));
  assert.throws(() => createVerifier({ audience: 'billing', jwks: { keys: [{ ...a.jwk, d }] } }), /public Ed25519 key/);
  assert.throws(() => createVerifier({ audience: 'billing', jwks: { keys: [{ ...a.jwk, kid: undefined }] } }), /with a kid/);
  assert.throws(() => createVerifier({ audience: 'billing', jwks: { keys: [{ kty: 'oct', kid: 'k', k: 'c2VjcmV0' }] } }), /public Ed25519 key/);
  assert.throws(() => createVerifier({ audience: '', jwksFile: goldenJWKS }), /audience/);
  assert.throws(() => createVerifier({ audience: 'billing' }), /exactly one/);
});

// The arguments are bound by their canonical form (envelope_test.go's TestArgsDigest).
test('argsDigest', () => {
  const cases = [
    ['{"a":1,"b":"x"}', '{ "b" : "x", "a" : 1.0 }', true],
    ['{"s":"\\u00e9"}', '{"s":"é"}', true],
    [undefined, '{}', true],
    ['null', '{}', true],
    ['{"amount":40}', '{"amount":41}', false],
    ['{"amount":40}', '{"amount":"40"}', false],
    ['{"a":{"b":[1,2]}}', '{"a":{"b":[2,1]}}', false],
  ];
  const d = s => argsDigest(s === undefined ? undefined : JSON.parse(s));
  for (const [x, y, same] of cases) assert.equal(d(x) === d(y), same, `${x} vs ${y}`);
  assert.equal(argsDigest(goldenArgs()), goldenClaims().args_digest);
  assert.throws(() => argsDigest({ s: '\ud800' }));
});

const goldenArgs = () => ({ order_id: 'A-100', amount: 40, reason_code: 'duplicate_charge' });

// capsnap's schema digest: the published vectors (mcpparse/testdata/digest/vectors.json).
test('toolDigest agrees with capsnap on every published vector', () => {
  const vectors = JSON.parse(readFileSync(testdata + '../../mcpparse/testdata/digest/vectors.json', 'utf8'));
  assert.ok(vectors.length >= 10);
  for (const v of vectors) {
    assert.equal(toolDigest(JSON.parse(v.definition)), v.digest, v.name);
  }
  assert.throws(() => toolDigest({ description: 'no name' }), /no name/);
  assert.throws(() => toolDigest({ name: 'x', inputSchema: [] }), /an object/);
});
