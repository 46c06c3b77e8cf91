// Guards an MCP server built on the official TypeScript SDK
// (@modelcontextprotocol/sdk, 1.32.2 here) with a capsnap envelope verifier:
// every tools/call is checked before the SDK dispatches it to the tool's
// handler, and refused with JSON-RPC error -31000 and data.reason unless it
// carries an envelope that capsnap signed for exactly this call, to this
// server, against the definition this server lists for the tool.
//
// Why around the tools/call request handler, not inside each tool handler:
// McpServer turns whatever a tool handler throws (an McpError too, save
// UrlElicitationRequired) into a CallToolResult with isError set and the
// message as text, so a refusal thrown there would lose its code and data;
// and a tool handler gets its arguments after the input schema's parse
// (zod strips unknown members, fills defaults), not the arguments capsnap
// saw. Here the check sees the request as it arrived: the tool's name, its
// raw arguments, the JSON-RPC id (extra.requestId) and the HTTP headers
// (extra.requestInfo.headers, which the streamable HTTP transport fills):
// x-capsnap-envelope, and x-capsnap-grant when capsnap sent the envelope
// under a grant.

import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { CODE_REFUSED, EnvelopeError, GRANT_HEADER, HEADER, toolDigest } from './envelope.js';

const GUARDED = Symbol.for('capsnap.envelope.guarded');

/**
 * @typedef {object} GuardOptions
 * @property {(refusal: EnvelopeError, call: {tool: string, requestId: unknown}) => void} [onRefusal]
 *   told of every refusal (to log or count it); it cannot change the answer
 * @property {(claims: import('./envelope.js').Claims) => void} [onVerified]
 *   told of every envelope that verified, before the handler runs
 */

/**
 * Guards every tool of server. Call it once the tools are registered (the
 * SDK installs McpServer's tools/list and tools/call handlers with the
 * first tool), before connecting a transport.
 *
 * The schema digest compared is that of the tool's definition as this
 * server lists it now: the entry its own tools/list handler returns, so
 * that a redeploy that changed the definition, or a tool capsnap never saw,
 * is refused as handler_drift.
 *
 * @param {import('@modelcontextprotocol/sdk/server/mcp.js').McpServer | import('@modelcontextprotocol/sdk/server/index.js').Server} server
 *   an McpServer, or a low-level Server with tools/list and tools/call handlers
 * @param {{verify: (presented: import('./envelope.js').Presented, call: import('./envelope.js').Call) => Promise<import('./envelope.js').Claims>}} verifier
 *   from createVerifier
 * @param {GuardOptions} [options]
 */
export function guardServer(server, verifier, options = {}) {
  const low = /** @type {any} */ ('server' in server ? server.server : server);
  // The request handlers the Protocol dispatches by method. The SDK offers
  // setRequestHandler to replace one but no way to read one back, so the
  // map is read directly; the tests pin the SDK version this holds for.
  const handlers = low?._requestHandlers;
  if (!(handlers instanceof Map)) {
    throw new TypeError('capsnap envelope: not an MCP SDK server this guard knows (no request handler map)');
  }
  const call = handlers.get('tools/call');
  const list = handlers.get('tools/list');
  if (!call || !list) {
    throw new Error('capsnap envelope: the server has no tools/list and tools/call handlers yet: register its tools first');
  }
  if (call[GUARDED]) return;

  /**
   * The definition server lists for tool, following pagination.
   * @param {string} tool
   * @param {any} extra
   */
  async function listed(tool, extra) {
    let cursor;
    for (let page = 0; page < 100; page++) {
      const res = await list({ method: 'tools/list', params: cursor === undefined ? {} : { cursor } }, extra);
      const def = res?.tools?.find(/** @param {any} t */ t => t?.name === tool);
      if (def) return def;
      cursor = res?.nextCursor;
      if (cursor === undefined) break;
    }
    return undefined;
  }

  /**
   * @param {any} request the JSON-RPC request, as it arrived
   * @param {any} extra the SDK's RequestHandlerExtra
   */
  const guarded = async (request, extra) => {
    const params = request?.params ?? {};
    const tool = typeof params.name === 'string' ? params.name : '';
    const headers = extra?.requestInfo?.headers;
    try {
      const claims = await verifier.verify({ envelope: header(headers, HEADER), grant: header(headers, GRANT_HEADER) }, {
        tool,
        arguments: params.arguments,
        requestId: extra?.requestId,
        schemaDigest: async () => {
          const def = await listed(tool, extra);
          if (!def) {
            throw new EnvelopeError('handler_drift', `this server lists no tool ${JSON.stringify(tool)}`);
          }
          return toolDigest(def);
        },
      });
      options.onVerified?.(claims);
    } catch (e) {
      if (!(e instanceof EnvelopeError)) throw e;
      try {
        options.onRefusal?.(e, { tool, requestId: extra?.requestId });
      } catch { /* a hook cannot change the answer */ }
      throw new McpError(CODE_REFUSED, `tool ${JSON.stringify(tool)} refused at handler start: ${e.message}`, {
        reason: e.reason, detail: e.detail, tool,
      });
    }
    return call(request, extra);
  };
  guarded[GUARDED] = true;
  handlers.set('tools/call', guarded);
}

/**
 * The request header name (lower case, as Node gives them); several of it
 * are joined, as one that does not verify.
 * @param {Record<string, string | string[] | undefined> | undefined} headers
 * @param {string} name
 */
function header(headers, name) {
  const raw = headers?.[name];
  return Array.isArray(raw) ? (raw.length === 1 ? raw[0] : raw.join(', ')) : raw;
}
