// Shared by the tests: the Go golden files (envelope/testdata) and a signer
// that seals envelopes as capsnap does, with the golden keys; and grants as
// capsnap makes them (envelope/grant.go), with the golden grant keys.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { CompactEncrypt, CompactSign, calculateJwkThumbprint, exportJWK, importPKCS8, importSPKI } from 'jose';

export const testdata = fileURLToPath(new URL('../../../envelope/testdata/', import.meta.url));
export const golden = readFileSync(testdata + 'envelope.jws', 'utf8').trim();
export const goldenJWKS = testdata + 'jwks.json';
/** The golden grant (sealed with key-a.pem, its call key to grant-key-a.pub.pem) and the call under it, for refundCall. */
export const goldenGrant = readFileSync(testdata + 'grant.jws', 'utf8').trim();
export const goldenCall = readFileSync(testdata + 'call.jws', 'utf8').trim();
/** The golden envelope's iat, and a clock 5 s later, in ms. */
export const IAT = 1_900_000_000;
export const at = seconds => () => (IAT + seconds) * 1000;

/** The golden claims, decoded from the golden envelope. */
export const goldenClaims = () => JSON.parse(Buffer.from(golden.split('.')[1], 'base64url').toString('utf8'));

/** The call the golden envelope was sealed for, its arguments written another way. */
export const refundCall = () => ({
  tool: 'refund',
  arguments: JSON.parse('{"reason_code":"duplicate_charge", "amount":40.0, "order_id":"A-100"}'),
  requestId: 7,
});

/**
 * A golden key (key-a.pem, key-b.pem): its private key, its public JWK with
 * the kid capsnap gives it (the RFC 7638 thumbprint), and a seal function.
 * @param {string} file
 */
export async function goldenKey(file) {
  const priv = await importPKCS8(readFileSync(testdata + file, 'utf8'), 'EdDSA', { extractable: true });
  const { d, ...pub } = await exportJWK(priv); // eslint-disable-line no-unused-vars
  const kid = await calculateJwkThumbprint(pub);
  const jwk = { use: 'sig', kty: pub.kty, kid, crv: pub.crv, alg: 'EdDSA', x: pub.x };
  /**
   * @param {object} claims
   * @param {object} [header] replaces members of the protected header
   */
  const seal = (claims, header = {}) => new CompactSign(new TextEncoder().encode(JSON.stringify(claims)))
    .setProtectedHeader({ alg: 'EdDSA', kid, typ: 'capsnap-envelope+jwt', ...header })
    .sign(priv);
  return { priv, jwk, kid, seal };
}

const encode = claims => new TextEncoder().encode(JSON.stringify(claims));

/**
 * The public half of a golden grant key (grant-key-a.pub.pem, grant-key-b.pub.pem),
 * its kid (the RFC 7638 thumbprint) and how capsnap encrypts a call key to it.
 * @param {string} file
 */
export async function grantRecipient(file) {
  const pub = await importSPKI(readFileSync(testdata + file, 'utf8'), 'ECDH-ES', { extractable: true });
  const kid = await calculateJwkThumbprint(await exportJWK(pub));
  /**
   * @param {Uint8Array} key
   * @param {object} [header] replaces members of the JWE's protected header
   */
  const encrypt = (key, header = {}) => new CompactEncrypt(key)
    .setProtectedHeader({ alg: 'ECDH-ES', enc: 'A256GCM', kid, ...header })
    .encrypt(pub);
  return { pub, kid, encrypt };
}

/** The claims of a grant for the golden call's tool, as grant_test.go's grantClaims (exp 5 minutes on). */
export function grantClaims() {
  const { args_digest, rid, ...c } = goldenClaims(); // eslint-disable-line no-unused-vars
  return { ...c, exp: IAT + 300, jti: `grant-${Math.random().toString(36).slice(2)}` };
}

/** The claims of the golden call's envelope under a grant, as grant_test.go's callClaims. */
export function callClaims(jti = `call-${Math.random().toString(36).slice(2)}`) {
  const c = goldenClaims();
  return { iat: c.iat, exp: c.exp, jti, args_digest: c.args_digest, rid: c.rid };
}

/**
 * A grant as capsnap makes one (envelope/grant.go, Keys.Grant): signed by
 * signer (a goldenKey), with a fresh call key encrypted to recipient (a
 * grantRecipient); edit sees the claims, call_key set, before signing.
 * seal makes a call's envelope under it, as Grant.Seal.
 * @param {Awaited<ReturnType<typeof goldenKey>>} signer
 * @param {Awaited<ReturnType<typeof grantRecipient>>} recipient
 * @param {(claims: Record<string, any>) => void} [edit]
 * @param {{callKey?: Uint8Array, header?: object}} [o] the call key, and members of the grant's JWS header
 */
export async function makeGrant(signer, recipient, edit = () => {}, o = {}) {
  const callKey = o.callKey ?? randomBytes(32);
  const claims = { ...grantClaims(), call_key: await recipient.encrypt(callKey) };
  edit(claims);
  const token = await signer.seal(claims, { typ: 'capsnap-grant+jwt', ...o.header });
  /**
   * @param {Record<string, any>} [call] the call's claims (grant set to the grant's jti unless given)
   * @param {object} [header] replaces members of the protected header
   * @param {Uint8Array} [key] MAC under another key
   */
  const seal = (call = callClaims(), header = {}, key = callKey) => new CompactSign(encode({ grant: claims.jti, ...call }))
    .setProtectedHeader({ alg: 'HS256', kid: claims.jti, typ: 'capsnap-call+jwt', ...header })
    .sign(key);
  return { token, claims, callKey, seal };
}
