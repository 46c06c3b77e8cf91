// guardServer on a real McpServer of the pinned SDK over streamable HTTP
// (the example server): a call with capsnap's envelope for exactly it runs
// its handler; every other call is refused with JSON-RPC error -31000 and
// data.reason before the handler starts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { argsDigest, toolDigest } from '../src/envelope.js';
import { startServer } from '../example/server.mjs';
import { IAT, at, goldenClaims, goldenJWKS, goldenKey } from './helpers.js';

let srv, a, b;
before(async () => {
  srv = await startServer({ addr: '127.0.0.1:0', serverId: 'billing', jwksFile: goldenJWKS, now: at(5) });
  a = await goldenKey('key-a.pem');
  b = await goldenKey('key-b.pem');
});
after(() => srv.close());

let nextId = 100;

/** A client session, speaking JSON-RPC over plain HTTP, so that the test chooses every header and id. */
async function session() {
  const post = async (body, headers = {}, sid) => {
    const res = await fetch(`${srv.url}/mcp`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json', accept: 'application/json, text/event-stream',
        ...(sid ? { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' } : {}), ...headers,
      },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    return { res, msg: text ? JSON.parse(text) : undefined };
  };
  const init = await post({
    jsonrpc: '2.0', id: nextId++, method: 'initialize',
    params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'test', version: '0' } },
  });
  assert.equal(init.res.status, 200, JSON.stringify(init.msg));
  const sid = init.res.headers.get('mcp-session-id');
  await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, {}, sid);
  const rpc = (method, params, headers, id = nextId++) => post({ jsonrpc: '2.0', id, method, params }, headers, sid).then(r => r.msg);
  return { rpc };
}

const refundArgs = { order_id: 'A-100', amount: 40, reason_code: 'duplicate_charge' };

/** The envelope capsnap would sign for this call, with edits. */
async function envelopeFor(s, { tool = 'refund', args = refundArgs, id, key = a, edit = () => {} } = {}) {
  const { tools } = (await s.rpc('tools/list', {})).result;
  const def = tools.find(t => t.name === tool);
  const c = {
    ...goldenClaims(), jti: `jti-${Math.random()}`, tool,
    schema_digest: def ? toolDigest(def) : 'sha256:' + '0'.repeat(64),
    args_digest: argsDigest(args), rid: id,
  };
  edit(c);
  return key.seal(c);
}

const starts = tool => srv.stats.handler_starts[tool] ?? 0;

async function refused(s, { tool = 'refund', args = refundArgs, id = nextId++, headers }) {
  const before = starts(tool);
  const msg = await s.rpc('tools/call', { name: tool, arguments: args }, headers, id);
  assert.equal(starts(tool), before, 'the handler started');
  assert.ok(msg.error, `not refused: ${JSON.stringify(msg)}`);
  assert.equal(msg.error.code, -31000, JSON.stringify(msg.error));
  assert.equal(msg.id, id);
  return msg.error.data.reason;
}

test('a call with its envelope runs the handler', async () => {
  const s = await session();
  const id = nextId++;
  const token = await envelopeFor(s, { id });
  const before = starts('refund');
  const msg = await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, { 'x-capsnap-envelope': token }, id);
  assert.equal(msg.result?.isError, undefined, JSON.stringify(msg));
  assert.match(msg.result.content[0].text, /refunded 40 USD on A-100/);
  assert.equal(starts('refund'), before + 1);
});

test('refusals before the handler starts', async () => {
  const s = await session();
  const id = () => nextId++;
  let i;
  // Forged capsnap headers, as a request that bypassed Envoy could write them, and no envelope.
  assert.equal(await refused(s, { headers: { 'x-capsnap-schema-digest': 'sha256:' + 'a'.repeat(64), 'x-capsnap-epoch': 'ep_forged', 'x-capsnap-principal': 'spiffe://acme/agent/support-refund' } }), 'envelope_missing');
  // Replayed, with other arguments.
  i = id();
  const used = await envelopeFor(s, { id: i });
  assert.equal((await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, { 'x-capsnap-envelope': used }, i)).result?.isError, undefined);
  assert.equal(await refused(s, { id: i, args: { ...refundArgs, amount: 250 }, headers: { 'x-capsnap-envelope': used } }), 'envelope_mismatch');
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': used } }), 'envelope_replayed');
  // For another request of the session.
  i = id();
  assert.equal(await refused(s, { id: i + 1000, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i }) } }), 'envelope_mismatch');
  // For another tool.
  i = id();
  assert.equal(await refused(s, { id: i, tool: 'lookup_order', args: { order_id: 'A-100' }, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i }) } }), 'envelope_mismatch');
  // Expired.
  i = id();
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i, edit: c => { c.iat = IAT - 60; c.exp = IAT - 30; } }) } }), 'envelope_expired');
  // Signed by a key capsnap does not publish.
  i = id();
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i, key: b }) } }), 'envelope_invalid');
  // For another server.
  i = id();
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i, edit: c => { c.aud = 'payments'; } }) } }), 'envelope_foreign');
  // Authorized against another definition of the tool.
  i = id();
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i, edit: c => { c.schema_digest = 'sha256:' + 'b'.repeat(64); } }) } }), 'handler_drift');
  // For a tool this server does not list.
  i = id();
  assert.equal(await refused(s, { id: i, tool: 'wire_transfer', args: {}, headers: { 'x-capsnap-envelope': await envelopeFor(s, { id: i, tool: 'wire_transfer', args: {} }) } }), 'handler_drift');
  assert.ok(srv.stats.refusals.envelope_missing >= 1);
});

test('a refusal is a JSON-RPC error with the documented data', async () => {
  const s = await session();
  const msg = await s.rpc('tools/call', { name: 'refund', arguments: refundArgs });
  assert.equal(msg.error.code, -31000);
  assert.equal(msg.error.data.reason, 'envelope_missing');
  assert.equal(msg.error.data.tool, 'refund');
  assert.match(msg.error.data.detail, /x-capsnap-envelope/);
});

test('other methods are not guarded', async () => {
  const s = await session();
  const msg = await s.rpc('tools/list', {});
  assert.deepEqual(msg.result.tools.map(t => t.name), ['refund', 'lookup_order']);
});

test('guardServer wants the tools registered first', async () => {
  const { McpServer } = await import('@modelcontextprotocol/sdk/server/mcp.js');
  const { createVerifier } = await import('../src/envelope.js');
  const v = createVerifier({ audience: 'billing', jwksFile: goldenJWKS });
  const { guardServer } = await import('../src/mcp.js');
  assert.throws(() => guardServer(new McpServer({ name: 'x', version: '0' }), v), /register its tools first/);
});
