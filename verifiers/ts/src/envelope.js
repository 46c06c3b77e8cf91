// capsnap's envelope (docs/ENVELOPE.md), checked in Node.js: the compact JWS
// (EdDSA, Ed25519) capsnap attaches to an allowed tools/call as the request
// header x-capsnap-envelope, binding the call it authorized to the contract
// it authorized it against.
//
// JWS is checked with jose (npm `jose`, pinned in package.json): the
// maintained JOSE library of the JavaScript ecosystem, on Web Crypto, with
// no dependencies, whose compactVerify takes an allowlist of algorithms (so
// that neither "none" nor an HMAC keyed with the public key can pass for
// EdDSA) and whose JWKS sets refetch a remote set on an unknown kid, with a
// cooldown. The arguments and the tool definition are canonicalized with
// `canonicalize` (npm), the RFC 8785 implementation by one of the RFC's
// authors; JCS orders members by UTF-16 code units and writes numbers as
// ECMAScript does, so JavaScript is the scheme's reference platform.
//
// For a server that holds a grant key, capsnap splits the envelope in two
// (docs/ENVELOPE.md, "Under a grant"): a grant in x-capsnap-grant, signed
// once per snapshot and tool (EdDSA, typ capsnap-grant+jwt), that carries a
// call key encrypted to the server (a compact JWE, ECDH-ES on P-256 with
// A256GCM); and, in x-capsnap-envelope, each call's envelope, an HS256 JWS
// under that call key (typ capsnap-call+jwt). The verifier opens a grant
// once and keeps it until it expires; each call then costs one HMAC.
//
// This module knows nothing of MCP; ./mcp.js guards an MCP SDK server with it.

import { createHash, createPrivateKey, createPublicKey, webcrypto } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { compactDecrypt, compactVerify, createLocalJWKSet, createRemoteJWKSet, decodeProtectedHeader } from 'jose';
import canonicalize from 'canonicalize';

/** The request header that carries the envelope. */
export const HEADER = 'x-capsnap-envelope';
/** The envelope's "typ": a JWS of another type under the same key (an audit checkpoint) is never an envelope. */
export const TYPE = 'capsnap-envelope+jwt';
/** The "iss" of every envelope. */
export const ISSUER = 'capsnap';
/** The only algorithm an envelope is signed with. */
export const ALGORITHM = 'EdDSA';
/** The JSON-RPC error code of a refusal (capsnap's own denials use it too). */
export const CODE_REFUSED = -31000;
/** The request header that carries the grant an envelope is under, if capsnap sent one. */
export const GRANT_HEADER = 'x-capsnap-grant';
/** A grant's "typ" (signed with EdDSA under the JWKS's keys, as an envelope signed whole). */
export const GRANT_TYPE = 'capsnap-grant+jwt';
/** The "typ" of an envelope under a grant. */
export const CALL_TYPE = 'capsnap-call+jwt';
/** The only algorithm an envelope under a grant is MAC'd with, under its grant's call key. */
export const CALL_ALGORITHM = 'HS256';
/** The size of a call key, in bytes: HS256's own. */
const CALL_KEY_SIZE = 32;
/** A grant's call key: direct key agreement (ECDH-ES) with A256GCM, and nothing else. */
const KEY_ALGORITHM = 'ECDH-ES';
const KEY_ENCRYPTION = 'A256GCM';
/** How many grants a verifier keeps open by default: past it, it drops those expired, then the oldest. */
export const MAX_GRANTS = 4096;

/**
 * Why a call is refused: its JSON-RPC error's data.reason.
 * @readonly
 */
export const Reason = Object.freeze({
  Missing: 'envelope_missing',
  Invalid: 'envelope_invalid',
  Expired: 'envelope_expired',
  Foreign: 'envelope_foreign',
  Replayed: 'envelope_replayed',
  Mismatch: 'envelope_mismatch',
  HandlerDrift: 'handler_drift',
});

/** A refusal: reason is one of Reason's values, detail says what was wrong. */
export class EnvelopeError extends Error {
  /**
   * @param {string} reason
   * @param {string} detail
   */
  constructor(reason, detail) {
    super(`${reason}: ${detail}`);
    this.name = 'EnvelopeError';
    this.reason = reason;
    this.detail = detail;
  }
}

/**
 * @typedef {object} Claims What an envelope says (docs/ENVELOPE.md).
 * @property {string} iss
 * @property {string} aud
 * @property {string} sub
 * @property {number} iat
 * @property {number} exp
 * @property {string} jti
 * @property {string} epoch
 * @property {string} tool
 * @property {string} schema_digest
 * @property {string} effect_class
 * @property {string} policy_digest
 * @property {string} args_digest
 * @property {string|number|null} rid
 * @property {string} [grant] the jti of the grant the envelope is under, if it is under one
 */

/**
 * @typedef {object} Presented What a request carries.
 * @property {string} [envelope] the x-capsnap-envelope header's value
 * @property {string} [grant] the x-capsnap-grant header's value, if capsnap sent one
 */

// Every claim, and its type. An envelope has each, and no other: a member
// this verifier does not know could be a restriction it would not enforce.
const CLAIMS = {
  iss: 'string', aud: 'string', sub: 'string', iat: 'integer', exp: 'integer', jti: 'string',
  epoch: 'string', tool: 'string', schema_digest: 'string', effect_class: 'string',
  policy_digest: 'string', args_digest: 'string', rid: 'id',
};
// Claims that may not be empty (exp may not be 0).
const REQUIRED = ['jti', 'tool', 'schema_digest', 'args_digest'];
// Under a grant, the claims are split: the grant's are those the same for
// every call of the tool under the snapshot, and the call key; the call's
// are those of the call alone, and the grant's jti.
const GRANT_CLAIMS = {
  iss: 'string', aud: 'string', sub: 'string', iat: 'integer', exp: 'integer', jti: 'string',
  epoch: 'string', tool: 'string', schema_digest: 'string', effect_class: 'string',
  policy_digest: 'string', call_key: 'string',
};
const CALL_CLAIMS = {
  grant: 'string', iat: 'integer', exp: 'integer', jti: 'string', args_digest: 'string', rid: 'id',
};

const sha256 = text => 'sha256:' + createHash('sha256').update(text, 'utf8').digest('hex');

/**
 * The digest an envelope binds a call's arguments by: "sha256:" and the hex
 * SHA-256 of their RFC 8785 canonical form, "{}" when the call has none.
 * Throws if they cannot be canonicalized (a lone surrogate, say).
 * @param {unknown} args the arguments object as the SDK parsed it
 * @returns {string}
 */
export function argsDigest(args) {
  return sha256(args === undefined || args === null ? '{}' : canonicalize(args));
}

// The members of a tool definition that decide what the model plans against
// and what the server accepts (mcpparse/digest.go): _meta, icons and
// execution do not count.
const GOVERNING = ['name', 'title', 'description', 'inputSchema', 'outputSchema', 'annotations'];

/**
 * capsnap's schema digest of one tool definition, as the server lists it
 * (`capsnap digest`): "sha256:" and the hex SHA-256 of the RFC 8785
 * canonical form of its governing members, absent ones omitted.
 * @param {Record<string, unknown>} definition a tools/list entry
 * @returns {string}
 */
export function toolDigest(definition) {
  // As it goes on the wire: undefined members dropped, toJSON applied.
  const def = JSON.parse(JSON.stringify(definition));
  if (def === null || typeof def !== 'object' || Array.isArray(def)) {
    throw new TypeError('tool digest: a definition is a JSON object');
  }
  /** @type {Record<string, unknown>} */
  const governing = {};
  for (const k of GOVERNING) {
    if (!(k in def)) continue;
    const v = def[k];
    const isObject = v !== null && typeof v === 'object' && !Array.isArray(v);
    if ((k === 'name' || k === 'title' || k === 'description') ? typeof v !== 'string' : !isObject) {
      throw new TypeError(`tool digest: ${k} must be ${k === 'name' || k === 'title' || k === 'description' ? 'a string' : 'an object'}`);
    }
    governing[k] = v;
  }
  if (!governing.name) throw new TypeError('tool digest: the definition has no name');
  return sha256(canonicalize(governing));
}

/**
 * @typedef {object} Call What the handler is about to run, which the envelope must be about.
 * @property {string} tool the tool called
 * @property {unknown} [arguments] the call's arguments, as parsed from the request
 * @property {string|number} [requestId] the JSON-RPC id, if the SDK exposes it; undefined skips the check
 * @property {string | (() => string | Promise<string>)} [schemaDigest] the schema digest of the
 *   handler's own definition (or a function computing it, called only once the rest verified);
 *   undefined leaves that check to the caller
 */

/**
 * @typedef {object} VerifierOptions
 * @property {string} audience the server_id of the server this verifier guards
 * @property {string} [jwksFile] a JWKS file (`capsnap keys jwks --config FILE`)
 * @property {string} [jwksUrl] capsnap's GET /.well-known/jwks.json; fetched on first use, kept
 *   for `refresh`, and fetched again when an envelope names a kid it lacks (at most once a `cooldown`)
 * @property {object} [jwks] a JWKS object
 * @property {number} [refresh] how long a fetched JWKS is kept, in ms (default 5 minutes)
 * @property {number} [cooldown] how soon after a fetch an unknown kid may fetch the JWKS again,
 *   in ms (default 1 s, as capsnap's Go verifier)
 * @property {string[]} [grantKeyFiles] the server's grant keys, P-256 private keys (PEM PKCS #8, as
 *   `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes), several during a
 *   rotation: a grant's call key is decrypted with the one its JWE's kid names (the key's RFC 7638
 *   thumbprint). Without any, a call under a grant is refused and only envelopes signed whole are taken.
 * @property {number} [maxGrants] how many grants are kept open (default MAX_GRANTS, 4096): past it,
 *   those expired are dropped, then the oldest, and a grant dropped costs its checks again
 * @property {number} [leeway] clock skew allowed at exp, in seconds (default 5)
 * @property {() => number} [now] the clock, in ms since the epoch (default Date.now)
 */

/**
 * A verifier for one server. Give exactly one of jwksFile, jwksUrl and jwks.
 * @param {VerifierOptions} options
 */
export function createVerifier(options) {
  const { audience, jwksFile, jwksUrl, jwks } = options ?? {};
  if (typeof audience !== 'string' || audience === '') {
    throw new TypeError("capsnap envelope: a verifier needs its server's id (audience)");
  }
  if ([jwksFile, jwksUrl, jwks].filter(x => x !== undefined).length !== 1) {
    throw new TypeError('capsnap envelope: give a verifier exactly one of jwksFile, jwksUrl and jwks');
  }
  const leeway = options.leeway ?? 5;
  const now = options.now ?? Date.now;
  /** @type {(header: import('jose').JWSHeaderParameters) => Promise<CryptoKey>} */
  let keyFor;
  if (jwksUrl !== undefined) {
    const remote = createRemoteJWKSet(new URL(jwksUrl), {
      cacheMaxAge: options.refresh ?? 5 * 60_000, cooldownDuration: options.cooldown ?? 1_000, timeoutDuration: 5_000,
    });
    keyFor = async header => {
      try {
        return await remote(header);
      } catch (e) {
        if (e?.code === 'ERR_JWKS_NO_MATCHING_KEY') throw e;
        // The JWKS could not be had: refuse, never fail open.
        throw new EnvelopeError(Reason.Invalid, `the JWKS at ${jwksUrl} could not be fetched: ${e?.message ?? e}`);
      }
    };
  } else {
    const set = jwks ?? JSON.parse(readFileSync(/** @type {string} */ (jwksFile), 'utf8'));
    checkJWKS(set, jwksFile ?? 'jwks');
    keyFor = createLocalJWKSet(set);
  }

  /** @type {Map<string, import('node:crypto').KeyObject>} kid (RFC 7638 thumbprint) → grant key */
  const grantKeys = new Map();
  const { grantKeyFiles = [] } = options;
  if (!Array.isArray(grantKeyFiles)) {
    throw new TypeError('capsnap envelope: grantKeyFiles is an array of file names');
  }
  for (const file of grantKeyFiles) {
    const { kid, key } = readGrantKey(file);
    grantKeys.set(kid, key);
  }
  /**
   * The grants opened, by their token exactly as sent, until they expire (in
   * insertion order, so the first is the oldest).
   * @type {Map<string, {claims: Record<string, any>, key: CryptoKey}>}
   */
  const grants = new Map();
  const maxGrants = options.maxGrants ?? MAX_GRANTS;
  if (!Number.isSafeInteger(maxGrants) || maxGrants < 1) {
    throw new TypeError('capsnap envelope: maxGrants is a positive integer');
  }

  /** @type {Map<string, number>} jti → exp, until exp (+ leeway) has passed */
  const seen = new Map();
  let pruned = 0;

  /**
   * Checks what the request presents as the envelope of call and returns its
   * claims; a refusal throws an EnvelopeError. A call refused is not
   * remembered: only an envelope that verified in full uses up its jti.
   *
   * presented is the x-capsnap-envelope header's value, or {envelope, grant}
   * with the x-capsnap-grant header's too. With a grant (not undefined, null
   * or ''), the envelope must be a call's envelope under that grant, and the
   * claims returned are the grant's and the call's merged as an envelope
   * signed whole has them (exp the earlier of the two, jti the call's), and
   * grant, the grant's jti.
   * @param {string | undefined | Presented} presented
   * @param {Call} call
   * @returns {Promise<Claims>}
   */
  async function verify(presented, call) {
    const isPresented = presented !== null && typeof presented === 'object' && !Array.isArray(presented);
    const token = isPresented ? presented.envelope : presented;
    const grant = isPresented ? presented.grant : undefined;
    if (token === undefined || token === null || token === '') {
      throw new EnvelopeError(Reason.Missing, `the call carries no ${HEADER} header`);
    }
    if (typeof token !== 'string') {
      throw new EnvelopeError(Reason.Invalid, `${HEADER} is not one string`);
    }
    /** @type {Claims} */
    let c;
    if (grant === undefined || grant === null || grant === '') {
      c = /** @type {Claims} */ (parseClaims(await signed(token, TYPE), CLAIMS));
    } else if (typeof grant !== 'string') {
      throw new EnvelopeError(Reason.Invalid, `${GRANT_HEADER} is not one string`);
    } else {
      c = await underGrant(grant, token);
    }
    if (REQUIRED.some(k => c[k] === '') || c.exp === 0) {
      throw new EnvelopeError(Reason.Invalid, 'a claim is missing');
    }
    if (c.iss !== ISSUER || c.aud !== audience) {
      throw new EnvelopeError(Reason.Foreign, `issued by ${JSON.stringify(c.iss)} for ${JSON.stringify(c.aud)}; this is ${JSON.stringify(audience)}`);
    }
    const t = now() / 1000;
    if (t > c.exp + leeway) {
      throw new EnvelopeError(Reason.Expired, `expired at ${new Date(c.exp * 1000).toISOString()}`);
    }
    if (c.tool !== call.tool) {
      throw new EnvelopeError(Reason.Mismatch, `the envelope is for tool ${JSON.stringify(c.tool)}, the call is to ${JSON.stringify(call.tool)}`);
    }
    let args;
    try {
      args = argsDigest(call.arguments);
    } catch (e) {
      throw new EnvelopeError(Reason.Mismatch, `the call's arguments cannot be canonicalized: ${e?.message ?? e}`);
    }
    if (args !== c.args_digest) {
      throw new EnvelopeError(Reason.Mismatch, `the envelope binds arguments ${c.args_digest}, the call has ${args}`);
    }
    // Compared as JSON values, canonically: 7 and 7.0 are one id, 7 and "7" two.
    if (call.requestId !== undefined && canonicalize(call.requestId) !== canonicalize(c.rid)) {
      throw new EnvelopeError(Reason.Mismatch, `the envelope is for request ${JSON.stringify(c.rid)}, this is ${JSON.stringify(call.requestId)}`);
    }
    if (call.schemaDigest !== undefined) {
      const own = typeof call.schemaDigest === 'function' ? await call.schemaDigest() : call.schemaDigest;
      if (own !== c.schema_digest) {
        throw new EnvelopeError(Reason.HandlerDrift, `authorized against ${c.schema_digest}, the handler serves ${own}`);
      }
    }
    remember(c.jti, c.exp, t);
    return c;
  }

  /**
   * Checks token as a compact EdDSA JWS of type typ under a key of the JWKS;
   * its payload.
   * @param {string} token
   * @param {string} typ
   * @returns {Promise<Uint8Array>}
   */
  async function signed(token, typ) {
    const header = jwsHeader(token, ALGORITHM, typ);
    if (typeof header.kid !== 'string' || header.kid === '') {
      // A JWKS lookup without a kid would take any single key: never.
      throw new EnvelopeError(Reason.Invalid, `the ${typ === GRANT_TYPE ? 'grant' : 'envelope'} names no kid`);
    }
    try {
      return (await compactVerify(token, keyFor, { algorithms: [ALGORITHM] })).payload;
    } catch (e) {
      if (e instanceof EnvelopeError) throw e;
      if (e?.code === 'ERR_JWKS_NO_MATCHING_KEY') {
        throw new EnvelopeError(Reason.Invalid, `no key ${JSON.stringify(header.kid)} in the JWKS`);
      }
      if (e?.code === 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED') {
        throw new EnvelopeError(Reason.Invalid, `the signature does not verify under key ${JSON.stringify(header.kid)}`);
      }
      throw new EnvelopeError(Reason.Invalid, `not a compact EdDSA JWS: ${e?.message ?? e}`);
    }
  }

  /**
   * Opens an envelope under a grant: the grant's signature, its call key,
   * and the envelope's MAC under that key; the claims of both, merged.
   * @param {string} grantToken
   * @param {string} token
   * @returns {Promise<Claims>}
   */
  async function underGrant(grantToken, token) {
    const { claims: gc, key } = await openGrant(grantToken);
    const header = jwsHeader(token, CALL_ALGORITHM, CALL_TYPE, ' under the grant');
    if (header.kid !== gc.jti) {
      throw new EnvelopeError(Reason.Invalid, `the envelope is under grant ${JSON.stringify(header.kid)}, not the grant sent (${JSON.stringify(gc.jti)})`);
    }
    /** @type {Uint8Array} */
    let payload;
    try {
      ({ payload } = await compactVerify(token, key, { algorithms: [CALL_ALGORITHM] }));
    } catch {
      throw new EnvelopeError(Reason.Invalid, `the envelope's MAC does not verify under grant ${JSON.stringify(gc.jti)}'s call key`);
    }
    const c = parseClaims(payload, CALL_CLAIMS);
    if (c.grant !== gc.jti) {
      throw new EnvelopeError(Reason.Invalid, `the envelope names grant ${JSON.stringify(c.grant)}, not ${JSON.stringify(gc.jti)}`);
    }
    return {
      iss: gc.iss, aud: gc.aud, sub: gc.sub, iat: c.iat, exp: Math.min(c.exp, gc.exp), jti: c.jti,
      epoch: gc.epoch, tool: gc.tool, schema_digest: gc.schema_digest, effect_class: gc.effect_class,
      policy_digest: gc.policy_digest, args_digest: c.args_digest, rid: c.rid, grant: gc.jti,
    };
  }

  /**
   * Checks a grant's signature and decrypts its call key, once per grant:
   * kept by its exact token until it expires.
   * @param {string} token
   */
  async function openGrant(token) {
    const kept = grants.get(token);
    if (kept) return kept;
    const gc = parseClaims(await signed(token, GRANT_TYPE), GRANT_CLAIMS);
    if (gc.jti === '' || gc.call_key === '') {
      throw new EnvelopeError(Reason.Invalid, 'a grant claim is missing');
    }
    if (gc.iss !== ISSUER || gc.aud !== audience) {
      throw new EnvelopeError(Reason.Foreign, `a grant issued by ${JSON.stringify(gc.iss)} for ${JSON.stringify(gc.aud)}; this is ${JSON.stringify(audience)}`);
    }
    const g = { claims: gc, key: await callKey(gc.call_key) };
    if (!grants.has(token) && grants.size >= maxGrants) {
      const t = now() / 1000;
      for (const [k, o] of grants) if (t > o.claims.exp) grants.delete(k);
      for (const k of grants.keys()) {
        if (grants.size < maxGrants) break;
        grants.delete(k);
      }
    }
    grants.set(token, g);
    return g;
  }

  /**
   * Decrypts a grant's call key with the grant key its JWE's kid names.
   * @param {string} jwe
   * @returns {Promise<CryptoKey>} the call key, for HS256
   */
  async function callKey(jwe) {
    const want = `a compact ${KEY_ALGORITHM}/${KEY_ENCRYPTION} JWE`;
    if (jwe.split('.').length !== 5) {
      throw new EnvelopeError(Reason.Invalid, `the grant's call key is not ${want}`);
    }
    /** @type {Record<string, unknown>} */
    let header;
    try {
      header = decodeProtectedHeader(jwe);
    } catch (e) {
      throw new EnvelopeError(Reason.Invalid, `the grant's call key is not ${want}: ${e?.message ?? e}`);
    }
    if (header.alg !== KEY_ALGORITHM || header.enc !== KEY_ENCRYPTION || header.zip !== undefined) {
      throw new EnvelopeError(Reason.Invalid, `the grant's call key is not ${want}`);
    }
    const kid = header.kid;
    const key = typeof kid === 'string' ? grantKeys.get(kid) : undefined;
    if (key === undefined) {
      throw new EnvelopeError(Reason.Invalid, `the grant's call key is for grant key ${JSON.stringify(kid)}, which this server does not hold`);
    }
    try {
      const { plaintext } = await compactDecrypt(jwe, key, {
        keyManagementAlgorithms: [KEY_ALGORITHM], contentEncryptionAlgorithms: [KEY_ENCRYPTION],
      });
      if (plaintext.byteLength !== CALL_KEY_SIZE) throw new Error(`a call key of ${plaintext.byteLength} bytes`);
      return await webcrypto.subtle.importKey('raw', plaintext, { name: 'HMAC', hash: 'SHA-256' }, false, ['verify']);
    } catch {
      throw new EnvelopeError(Reason.Invalid, `the grant's call key does not decrypt under grant key ${JSON.stringify(kid)}`);
    }
  }

  /**
   * @param {string} jti
   * @param {number} exp
   * @param {number} t now, in seconds
   */
  function remember(jti, exp, t) {
    if (seen.has(jti)) {
      throw new EnvelopeError(Reason.Replayed, `envelope ${jti} was already used`);
    }
    if (t - pruned > 1) {
      for (const [id, e] of seen) if (e + leeway < t) seen.delete(id);
      pruned = t;
    }
    seen.set(jti, exp);
  }

  return { verify, audience };
}

/**
 * The protected header of token, a compact JWS that must be of alg and typ.
 * @param {string} token
 * @param {string} alg
 * @param {string} typ
 * @param {string} [what]
 */
function jwsHeader(token, alg, typ, what = '') {
  if (token.split('.').length !== 3) {
    throw new EnvelopeError(Reason.Invalid, `not a compact JWS${what}`);
  }
  /** @type {import('jose').ProtectedHeaderParameters} */
  let header;
  try {
    header = decodeProtectedHeader(token);
  } catch (e) {
    throw new EnvelopeError(Reason.Invalid, `not a compact JWS${what}: ${e?.message ?? e}`);
  }
  if (header.alg !== alg) {
    throw new EnvelopeError(Reason.Invalid, `alg ${JSON.stringify(header.alg)}, want ${alg}`);
  }
  if (header.typ !== typ) {
    throw new EnvelopeError(Reason.Invalid, `typ ${JSON.stringify(header.typ)}, want ${typ}`);
  }
  return header;
}

/**
 * A server's grant key: a P-256 private key, PEM PKCS #8 ("PRIVATE KEY"),
 * and its kid, the RFC 7638 thumbprint of its public half.
 * @param {string} file
 */
function readGrantKey(file) {
  const pem = readFileSync(file, 'utf8');
  if (!/-----BEGIN PRIVATE KEY-----/.test(pem)) {
    throw new TypeError(`capsnap envelope: ${file}: want a PEM "PRIVATE KEY" (PKCS #8)`);
  }
  let key;
  try {
    key = createPrivateKey({ key: pem, format: 'pem' });
  } catch (e) {
    throw new TypeError(`capsnap envelope: ${file}: not a private key: ${e?.message ?? e}`);
  }
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1') {
    const what = [key.asymmetricKeyType, key.asymmetricKeyDetails?.namedCurve].filter(Boolean).join(' ');
    throw new TypeError(`capsnap envelope: ${file}: a ${what} key, want a P-256 private key`);
  }
  const { kty, crv, x, y } = /** @type {import('node:crypto').JsonWebKey} */ (createPublicKey(key).export({ format: 'jwk' }));
  return { key, kid: thumbprint({ kty, crv, x, y }) };
}

/**
 * The RFC 7638 thumbprint (SHA-256, base64url) of an EC public JWK,
 * synchronously: jose's calculateJwkThumbprint computes the same, but
 * returns a promise, and createVerifier loads its keys at once.
 * @param {{kty?: string, crv?: string, x?: string, y?: string}} jwk
 */
function thumbprint({ kty, crv, x, y }) {
  // RFC 7638 §3.2: the required members, in lexicographic order, no white space.
  return createHash('sha256').update(JSON.stringify({ crv, kty, x, y })).digest('base64url');
}

/**
 * @param {any} set
 * @param {string} where
 */
function checkJWKS(set, where) {
  if (set === null || typeof set !== 'object' || !Array.isArray(set.keys)) {
    throw new TypeError(`capsnap envelope: ${where}: not a JSON Web Key Set`);
  }
  for (const k of set.keys) {
    if (typeof k?.kid !== 'string' || k.kid === '' || 'd' in k || k.kty !== 'OKP' || k.crv !== 'Ed25519') {
      throw new TypeError(`capsnap envelope: ${where}: every key must be a public Ed25519 key with a kid`);
    }
  }
}

/**
 * The claims of payload: every member spec names, of its type, and no other.
 * A member this verifier does not know could be a restriction it would not enforce.
 * @param {Uint8Array} payload
 * @param {Record<string, string>} spec
 * @returns {Record<string, any>}
 */
function parseClaims(payload, spec) {
  let c;
  try {
    c = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(payload));
  } catch (e) {
    throw new EnvelopeError(Reason.Invalid, `claims: ${e?.message ?? e}`);
  }
  if (c === null || typeof c !== 'object' || Array.isArray(c)) {
    throw new EnvelopeError(Reason.Invalid, 'claims: not a JSON object');
  }
  for (const k of Object.keys(c)) {
    if (!Object.hasOwn(spec, k)) throw new EnvelopeError(Reason.Invalid, `claims: unknown claim ${JSON.stringify(k)}`);
  }
  for (const [k, type] of Object.entries(spec)) {
    const v = c[k];
    const ok = type === 'integer' ? Number.isSafeInteger(v)
      : type === 'id' ? v === null || typeof v === 'string' || (typeof v === 'number' && Number.isFinite(v))
        : typeof v === type;
    if (!ok) throw new EnvelopeError(Reason.Invalid, `claims: ${k} is ${v === undefined ? 'missing' : 'not a ' + type}`);
  }
  return c;
}
