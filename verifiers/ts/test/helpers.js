// Shared by the tests: the Go golden files (envelope/testdata) and a signer
// that seals envelopes as capsnap does, with the golden keys.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { CompactSign, calculateJwkThumbprint, exportJWK, importPKCS8 } from 'jose';

export const testdata = fileURLToPath(new URL('../../../envelope/testdata/', import.meta.url));
export const golden = readFileSync(testdata + 'envelope.jws', 'utf8').trim();
export const goldenJWKS = testdata + 'jwks.json';
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
