// capsnap envelope verifier for MCP servers on the official TypeScript SDK.
// See README.md; docs/ENVELOPE.md is the format.
export {
  ALGORITHM, CODE_REFUSED, EnvelopeError, HEADER, ISSUER, Reason, TYPE,
  argsDigest, createVerifier, toolDigest,
} from './envelope.js';
export { guardServer } from './mcp.js';
