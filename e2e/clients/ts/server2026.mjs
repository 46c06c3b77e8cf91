// An MCP server on the official TypeScript SDK's split 2.x packages
// (@modelcontextprotocol/server with createMcpHandler, served on node:http
// by @modelcontextprotocol/node; pinned in package.json), the SDK's first
// release that speaks MCP 2026-07-28, for capsnap's end-to-end tests
// (e2e/rev2026_test.go). The server-everything release pinned beside it is
// on @modelcontextprotocol/sdk 1.x and speaks up to 2025-11-25.
//
//   node server2026.mjs --addr 127.0.0.1:8081 [--list-ttl-ms N]
//
// It serves the same two tools as verifiers/python/example/server.py (a
// refund that moves money, an order lookup) at /mcp: 2026-07-28 statelessly
// (server/discover, subscriptions/listen), earlier versions through the
// SDK's stateless legacy fallback. With --list-ttl-ms its tools/list
// results may be reused for that long (ttlMs, cacheScope "public"). It
// checks no envelope: the SDK's 2.x packages have no capsnap verifier.
// For the tests it also serves
//
//   GET  /admin/stats    {"variant", "handler_starts": {tool: n}}
//   POST /admin/variant  body "baseline" or "skip_fraud_check" (refund
//                        takes an optional skip_fraud_check too): redeploys
//                        refund as that variant, tells every
//                        subscriptions/listen stream that asked
//                        (notifications/tools/list_changed), answers the stats
import http from 'node:http';
import { parseArgs } from 'node:util';
import { McpServer, InMemoryServerEventBus, createMcpHandler, fromJsonSchema } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';

const { values: opts } = parseArgs({ options: { addr: { type: 'string', default: '127.0.0.1:8081' }, 'list-ttl-ms': { type: 'string', default: '0' } } });
const split = opts.addr.lastIndexOf(':');
const host = opts.addr.slice(0, split);
const port = Number(opts.addr.slice(split + 1));
const listTTL = Number(opts['list-ttl-ms']);

const variants = ['baseline', 'skip_fraud_check'];
const stats = { variant: variants[0], handler_starts: { refund: 0, lookup_order: 0 } };
// The fan-out to subscriptions/listen streams, which every request's
// server shares.
const bus = new InMemoryServerEventBus();

function refundSchema(variant) {
  const properties = {
    order_id: { type: 'string' },
    amount: { type: 'number', exclusiveMinimum: 0, maximum: 250, description: 'Amount in USD.' },
    reason_code: { type: 'string', enum: ['duplicate_charge', 'damaged', 'not_received'] },
  };
  if (variant === 'skip_fraud_check') {
    properties.skip_fraud_check = { type: 'boolean', description: 'Skip the fraud check.' };
  }
  return { type: 'object', properties, required: ['order_id', 'amount', 'reason_code'] };
}

// server is the McpServer that answers one request, as the variant served now.
function server() {
  const s = new McpServer({ name: 'capsnap-ts2026', version: '1' }, listTTL > 0 ? { cacheHints: { 'tools/list': { ttlMs: listTTL, cacheScope: 'public' } } } : {});
  s.registerTool('refund', {
    description: "Refund part or all of an order's charge, in USD.",
    inputSchema: fromJsonSchema(refundSchema(stats.variant)),
    annotations: { destructiveHint: true, idempotentHint: false },
  }, async ({ order_id, amount, reason_code }) => {
    stats.handler_starts.refund++;
    return { content: [{ type: 'text', text: `refunded ${amount} USD on ${order_id} (${reason_code})` }] };
  });
  s.registerTool('lookup_order', {
    description: 'Look an order up by its id.',
    inputSchema: fromJsonSchema({ type: 'object', properties: { order_id: { type: 'string' } }, required: ['order_id'] }),
    annotations: { readOnlyHint: true },
  }, async ({ order_id }) => {
    stats.handler_starts.lookup_order++;
    return { content: [{ type: 'text', text: `order ${order_id}: paid, 40 USD` }] };
  });
  return s;
}

const mcp = toNodeHandler(createMcpHandler(server, { bus, onerror: e => console.error(`mcp: ${e.message}`) }));

function reply(res, status, type, body) {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

http.createServer(async (req, res) => {
  const path = new URL(req.url, 'http://localhost').pathname;
  if (path === '/mcp') {
    return mcp(req, res);
  }
  if (path === '/admin/stats' && req.method === 'GET') {
    return reply(res, 200, 'application/json', JSON.stringify(stats));
  }
  if (path === '/admin/variant' && req.method === 'POST') {
    let body = '';
    for await (const chunk of req) {
      body += chunk;
    }
    const variant = body.trim();
    if (!variants.includes(variant)) {
      return reply(res, 400, 'text/plain', `unknown variant ${JSON.stringify(variant)} (want one of ${variants.join(', ')})`);
    }
    if (variant !== stats.variant) {
      stats.variant = variant;
      await bus.publish({ kind: 'tools_list_changed' });
    }
    return reply(res, 200, 'application/json', JSON.stringify(stats));
  }
  reply(res, 404, 'text/plain', 'not found');
}).listen(port, host, () => console.error(`capsnap's 2026-07-28 test server (TypeScript SDK 2.x) at http://${opts.addr}/mcp`));
