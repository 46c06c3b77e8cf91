// guardServer on a real McpServer of the pinned SDK over streamable HTTP
// (the example server): a call with capsnap's envelope for exactly it runs
// its handler; every other call is refused with JSON-RPC error -31000 and
// data.reason before the handler starts. The same under a grant
// (x-capsnap-grant beside x-capsnap-envelope), and the example's
// --grant-key flag.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { argsDigest, toolDigest } from '../src/envelope.js';
import { startServer } from '../example/server.mjs';
import { IAT, at, callClaims, goldenClaims, goldenJWKS, goldenKey, grantRecipient, makeGrant, testdata } from './helpers.js';

let srv, a, b, billing, payments;
before(async () => {
  srv = await startServer({
    addr: '127.0.0.1:0', serverId: 'billing', jwksFile: goldenJWKS, grantKeyFiles: [testdata + 'grant-key-a.pem'], now: at(5),
  });
  a = await goldenKey('key-a.pem');
  b = await goldenKey('key-b.pem');
  billing = await grantRecipient('grant-key-a.pub.pem');
  payments = await grantRecipient('grant-key-b.pub.pem');
});
after(() => srv.close());

let nextId = 100;

/** A client session, speaking JSON-RPC over plain HTTP, so that the test chooses every header and id. */
async function session(url = srv.url) {
  const post = async (body, headers = {}, sid) => {
    const res = await fetch(`${url}/mcp`, {
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

/**
 * A grant capsnap would sign for tool as this server lists it, and a seal
 * for the envelope of one call under it, with edits.
 */
async function grantFor(s, { tool = 'refund', key = a, to = billing, edit = () => {}, claims = {} } = {}) {
  const { tools } = (await s.rpc('tools/list', {})).result;
  const g = await makeGrant(key, to, c => {
    Object.assign(c, { tool, schema_digest: toolDigest(tools.find(t => t.name === tool)) }, claims);
    edit(c);
  });
  /** The headers of a call under the grant. */
  const headers = async ({ args = refundArgs, id, edit: editCall = () => {} }) => {
    const c = { ...callClaims(), args_digest: argsDigest(args), rid: id };
    editCall(c);
    return { 'x-capsnap-envelope': await g.seal(c), 'x-capsnap-grant': g.token };
  };
  return { ...g, headers };
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

test('calls under a grant run the handler, one grant for many calls', async () => {
  const s = await session();
  const g = await grantFor(s);
  const before = starts('refund');
  for (let n = 0; n < 2; n++) {
    const id = nextId++;
    const msg = await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, await g.headers({ id }), id);
    assert.equal(msg.result?.isError, undefined, JSON.stringify(msg));
    assert.match(msg.result.content[0].text, /refunded 40 USD on A-100/);
  }
  assert.equal(starts('refund'), before + 2);
});

test('refusals under a grant before the handler starts', async () => {
  const s = await session();
  const g = await grantFor(s);
  const id = () => nextId++;
  let i;
  // Replayed, and first with other arguments.
  i = id();
  const used = await g.headers({ id: i });
  assert.equal((await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, used, i)).result?.isError, undefined);
  assert.equal(await refused(s, { id: i, args: { ...refundArgs, amount: 250 }, headers: used }), 'envelope_mismatch');
  assert.equal(await refused(s, { id: i, headers: used }), 'envelope_replayed');
  // The envelope without its grant; the grant without an envelope.
  i = id();
  const h = await g.headers({ id: i });
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-envelope': h['x-capsnap-envelope'] } }), 'envelope_invalid');
  assert.equal(await refused(s, { id: i, headers: { 'x-capsnap-grant': h['x-capsnap-grant'] } }), 'envelope_missing');
  // For another request.
  i = id();
  assert.equal(await refused(s, { id: i + 1000, headers: await g.headers({ id: i }) }), 'envelope_mismatch');
  // A grant for refund, a call to lookup_order.
  i = id();
  assert.equal(await refused(s, { id: i, tool: 'lookup_order', args: { order_id: 'A-100' }, headers: await g.headers({ id: i, args: { order_id: 'A-100' } }) }), 'envelope_mismatch');
  // The call expired; the grant expired.
  i = id();
  assert.equal(await refused(s, { id: i, headers: await g.headers({ id: i, edit: c => { c.iat = IAT - 60; c.exp = IAT - 30; } }) }), 'envelope_expired');
  i = id();
  assert.equal(await refused(s, { id: i, headers: await (await grantFor(s, { claims: { exp: IAT - 30 } })).headers({ id: i }) }), 'envelope_expired');
  // A grant signed by a key capsnap does not publish; for another server; its call key to another server's grant key.
  i = id();
  assert.equal(await refused(s, { id: i, headers: await (await grantFor(s, { key: b })).headers({ id: i }) }), 'envelope_invalid');
  i = id();
  assert.equal(await refused(s, { id: i, headers: await (await grantFor(s, { claims: { aud: 'payments' } })).headers({ id: i }) }), 'envelope_foreign');
  i = id();
  assert.equal(await refused(s, { id: i, headers: await (await grantFor(s, { to: payments })).headers({ id: i }) }), 'envelope_invalid');
  // The envelope of one grant beside another.
  i = id();
  const other = await grantFor(s);
  assert.equal(await refused(s, { id: i, headers: { ...(await g.headers({ id: i })), 'x-capsnap-grant': other.token } }), 'envelope_invalid');
  // Authorized against another definition of the tool.
  i = id();
  assert.equal(await refused(s, { id: i, headers: await (await grantFor(s, { claims: { schema_digest: 'sha256:' + 'b'.repeat(64) } })).headers({ id: i }) }), 'handler_drift');
});

test('a server without a grant key refuses a call under a grant', async () => {
  const plain = await startServer({ addr: '127.0.0.1:0', serverId: 'billing', jwksFile: goldenJWKS, now: at(5) });
  try {
    const s = await session(plain.url);
    const g = await grantFor(s);
    const id = nextId++;
    const msg = await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, await g.headers({ id }), id);
    assert.equal(msg.error?.code, -31000, JSON.stringify(msg));
    assert.equal(msg.error.data.reason, 'envelope_invalid');
    assert.match(msg.error.data.detail, /does not hold/);
    assert.equal(plain.stats.handler_starts.refund, undefined);
  } finally {
    await plain.close();
  }
});

test('example/server.mjs --grant-key, repeated or a comma list', async () => {
  const script = fileURLToPath(new URL('../example/server.mjs', import.meta.url));
  const run = async args => {
    const child = spawn(process.execPath, [script, '--addr', '127.0.0.1:0', '--server-id', 'billing', '--jwks-file', goldenJWKS, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    const url = await new Promise((resolve, reject) => {
      child.stderr.on('data', d => {
        err += d;
        const m = /at (http:\/\/\S+)\/mcp/.exec(err);
        if (m) resolve(m[1]);
      });
      child.on('exit', code => reject(new Error(`exited ${code}: ${err}`)));
    });
    return { child, url, stderr: () => err };
  };
  // The server runs on the real clock: a grant and a call valid now.
  const t = Math.floor(Date.now() / 1000);
  const now = { iat: t, exp: t + 300 };
  for (const args of [
    ['--grant-key', testdata + 'grant-key-b.pem', '--grant-key', testdata + 'grant-key-a.pem'],
    ['--grant-key', `${testdata}grant-key-b.pem,${testdata}grant-key-a.pem`],
  ]) {
    const { child, url, stderr } = await run(args);
    try {
      assert.match(stderr(), /under a grant \(2 grant keys\)/);
      const s = await session(url);
      const g = await grantFor(s, { claims: now });
      const id = nextId++;
      const msg = await s.rpc('tools/call', { name: 'refund', arguments: refundArgs }, await g.headers({ id, edit: c => { c.iat = t; c.exp = t + 30; } }), id);
      assert.equal(msg.result?.isError, undefined, JSON.stringify(msg));
      assert.match(msg.result.content[0].text, /refunded 40 USD/);
    } finally {
      child.kill();
    }
  }
  // A grant key that is not one stops the server at start.
  await assert.rejects(run(['--grant-key', testdata + 'key-a.pem']), /want a P-256 private key/);
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
