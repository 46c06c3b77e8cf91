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
// This module knows nothing of MCP; ./mcp.js guards an MCP SDK server with it.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { compactVerify, createLocalJWKSet, createRemoteJWKSet, decodeProtectedHeader } from 'jose';
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

  /** @type {Map<string, number>} jti → exp, until exp (+ leeway) has passed */
  const seen = new Map();
  let pruned = 0;

  /**
   * Checks token as the envelope of call and returns its claims; a refusal
   * throws an EnvelopeError. A call refused is not remembered: only an
   * envelope that verified in full uses up its jti.
   * @param {string | undefined} token the x-capsnap-envelope header's value
   * @param {Call} call
   * @returns {Promise<Claims>}
   */
  async function verify(token, call) {
    if (token === undefined || token === null || token === '') {
      throw new EnvelopeError(Reason.Missing, `the call carries no ${HEADER} header`);
    }
    if (typeof token !== 'string') {
      throw new EnvelopeError(Reason.Invalid, `${HEADER} is not one string`);
    }
    /** @type {import('jose').ProtectedHeaderParameters} */
    let header;
    try {
      header = decodeProtectedHeader(token);
    } catch (e) {
      throw new EnvelopeError(Reason.Invalid, `not a compact JWS: ${e?.message ?? e}`);
    }
    if (token.split('.').length !== 3) {
      throw new EnvelopeError(Reason.Invalid, 'not a compact JWS');
    }
    if (header.alg !== ALGORITHM) {
      throw new EnvelopeError(Reason.Invalid, `alg ${JSON.stringify(header.alg)}, want ${ALGORITHM}`);
    }
    if (header.typ !== TYPE) {
      throw new EnvelopeError(Reason.Invalid, `typ ${JSON.stringify(header.typ)}, want ${TYPE}`);
    }
    if (typeof header.kid !== 'string' || header.kid === '') {
      // A JWKS lookup without a kid would take any single key: never.
      throw new EnvelopeError(Reason.Invalid, 'the envelope names no kid');
    }
    /** @type {Uint8Array} */
    let payload;
    try {
      ({ payload } = await compactVerify(token, keyFor, { algorithms: [ALGORITHM] }));
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
    const c = parseClaims(payload);
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
 * @param {Uint8Array} payload
 * @returns {Claims}
 */
function parseClaims(payload) {
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
    if (!Object.hasOwn(CLAIMS, k)) throw new EnvelopeError(Reason.Invalid, `claims: unknown claim ${JSON.stringify(k)}`);
  }
  for (const [k, type] of Object.entries(CLAIMS)) {
    const v = c[k];
    const ok = type === 'integer' ? Number.isSafeInteger(v)
      : type === 'id' ? v === null || typeof v === 'string' || (typeof v === 'number' && Number.isFinite(v))
        : typeof v === type;
    if (!ok) throw new EnvelopeError(Reason.Invalid, `claims: ${k} is ${v === undefined ? 'missing' : 'not a ' + type}`);
  }
  if (REQUIRED.some(k => c[k] === '') || c.exp === 0) {
    throw new EnvelopeError(Reason.Invalid, 'a claim is missing');
  }
  return c;
}
