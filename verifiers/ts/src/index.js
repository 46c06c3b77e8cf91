// capsnap envelope verifier for MCP servers on the official TypeScript SDK.
// See README.md; docs/ENVELOPE.md is the format.
export {
  ALGORITHM, CALL_ALGORITHM, CALL_TYPE, CODE_REFUSED, EnvelopeError, GRANT_HEADER, GRANT_TYPE, HEADER, ISSUER,
  MAX_GRANTS, Reason, TYPE,
  argsDigest, createVerifier, toolDigest,
} from './envelope.js';
export { guardServer } from './mcp.js';
