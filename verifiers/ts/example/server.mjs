// A small MCP server on the official TypeScript SDK (McpServer over
// streamable HTTP), guarded by capsnap's envelope verifier: a refund tool
// that moves money and an order lookup, neither of which runs unless capsnap
// signed an envelope for exactly that call.
//
//   node example/server.mjs --addr 127.0.0.1:8081 --server-id billing \
//        --jwks-url http://127.0.0.1:9002/.well-known/jwks.json
//   (or --jwks-file FILE, as `capsnap keys jwks --config FILE` prints it)
//   [--grant-key grant-key.pem]  (the private half of the key capsnap's
//   servers[].grant_key_file names, to take envelopes under a grant;
//   repeatable, or a comma list, during a rotation)
//
// It serves MCP at /mcp (stateful: a session begins with initialize), and
// GET /admin/stats: how often each handler started and each refusal
// reason was given, for the end-to-end tests (e2e/envelope_sdk_test.go).
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';
import { createVerifier, guardServer } from '../src/index.js';

/**
 * Starts the server.
 * @param {object} o
 * @param {string} o.addr host:port to listen on (port 0 picks one)
 * @param {string} o.serverId the server_id capsnap knows this server by: the envelope's audience
 * @param {string} [o.jwksUrl]
 * @param {string} [o.jwksFile]
 * @param {string[]} [o.grantKeyFiles] the server's grant keys (P-256, PEM PKCS #8), to take envelopes under a grant
 * @param {() => number} [o.now] the verifier's clock, in ms
 */
export async function startServer(o) {
  const verifier = createVerifier({
    audience: o.serverId, jwksUrl: o.jwksUrl, jwksFile: o.jwksFile, grantKeyFiles: o.grantKeyFiles, now: o.now,
  });
  const stats = { server_id: o.serverId, handler_starts: {}, refusals: {} };
  const started = tool => { stats.handler_starts[tool] = (stats.handler_starts[tool] ?? 0) + 1; };

  // One McpServer per session, as the SDK's examples do; the verifier,
  // and so its memory of envelopes used, is the process's.
  function mcpServer() {
    const server = new McpServer({ name: `capsnap-example-${o.serverId}`, version: '0.1.0' });
    server.registerTool('refund', {
      description: "Refund part or all of an order's charge, in USD.",
      inputSchema: {
        order_id: z.string(),
        amount: z.number().positive().max(250).describe('Amount in USD.'),
        reason_code: z.enum(['duplicate_charge', 'damaged', 'not_received']),
      },
      annotations: { destructiveHint: true, idempotentHint: false },
    }, async ({ order_id, amount, reason_code }) => {
      started('refund');
      return { content: [{ type: 'text', text: `refunded ${amount} USD on ${order_id} (${reason_code})` }] };
    });
    server.registerTool('lookup_order', {
      description: 'Look an order up by its id.',
      inputSchema: { order_id: z.string() },
      annotations: { readOnlyHint: true },
    }, async ({ order_id }) => {
      started('lookup_order');
      return { content: [{ type: 'text', text: `order ${order_id}: paid, 40 USD` }] };
    });
    guardServer(server, verifier, {
      onRefusal: (e, call) => {
        stats.refusals[e.reason] = (stats.refusals[e.reason] ?? 0) + 1;
        console.error(`refused ${call.tool} (request ${JSON.stringify(call.requestId)}): ${e.message}`);
      },
    });
    return server;
  }

  /** @type {Map<string, StreamableHTTPServerTransport>} */
  const sessions = new Map();
  const http = createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? '/', 'http://localhost');
      if (url.pathname === '/admin/stats' && req.method === 'GET') {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify(stats));
        return;
      }
      if (url.pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      const body = req.method === 'POST' ? await readJSON(req) : undefined;
      const sid = req.headers['mcp-session-id'];
      let transport = typeof sid === 'string' ? sessions.get(sid) : undefined;
      if (!transport) {
        if (sid !== undefined || req.method !== 'POST' || !isInitializeRequest(body)) {
          res.writeHead(sid === undefined ? 400 : 404, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: sid === undefined ? 'no session: initialize first' : 'unknown session' } }));
          return;
        }
        const t = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          enableJsonResponse: true,
          onsessioninitialized: id => { sessions.set(id, t); },
        });
        t.onclose = () => { if (t.sessionId) sessions.delete(t.sessionId); };
        await mcpServer().connect(t);
        transport = t;
      }
      await transport.handleRequest(req, res, body);
    } catch (e) {
      console.error('request failed:', e);
      if (!res.headersSent) res.writeHead(e instanceof SyntaxError ? 400 : 500).end();
    }
  });
  const [host, port] = splitAddr(o.addr);
  await new Promise((resolve, reject) => {
    http.once('error', reject);
    http.listen(port, host, resolve);
  });
  const { port: bound } = /** @type {import('node:net').AddressInfo} */ (http.address());
  return {
    url: `http://${host}:${bound}`,
    stats,
    close: async () => {
      for (const t of sessions.values()) await t.close();
      await new Promise(r => http.close(r));
    },
  };
}

/** @param {import('node:http').IncomingMessage} req */
async function readJSON(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

/** @param {string} addr */
function splitAddr(addr) {
  const i = addr.lastIndexOf(':');
  return [addr.slice(0, i) || '127.0.0.1', Number(addr.slice(i + 1))];
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:8081' },
      'server-id': { type: 'string', default: 'billing' },
      'jwks-url': { type: 'string' },
      'jwks-file': { type: 'string' },
      'grant-key': { type: 'string', multiple: true, default: [] },
    },
  });
  const grantKeyFiles = values['grant-key'].flatMap(v => v.split(',')).map(f => f.trim()).filter(Boolean);
  const s = await startServer({
    addr: values.addr, serverId: values['server-id'], jwksUrl: values['jwks-url'], jwksFile: values['jwks-file'], grantKeyFiles,
  });
  const grants = grantKeyFiles.length ? `, taking envelopes under a grant (${grantKeyFiles.length} grant key${grantKeyFiles.length === 1 ? '' : 's'})` : '';
  console.error(`capsnap example MCP server (TypeScript SDK) ${values['server-id']} at ${s.url}/mcp, guarded by the envelope verifier${grants}`);
  const stop = () => s.close().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
