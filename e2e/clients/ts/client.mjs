// An agent runner on the official TypeScript MCP SDK (@modelcontextprotocol/sdk,
// pinned in package.json), for capsnap's end-to-end tests (e2e/sdk_test.go).
//
//   node client.mjs
//
// It reads steps from stdin, one JSON object a line, runs each in turn on one
// Client over StreamableHTTPClientTransport, and answers each with one JSON
// line on stdout. So the test can act between steps (redeploy a server, say)
// while the session stays open. Steps:
//
//   {"id": "...", "op": "connect", "url": "...", "headers": {"x-capsnap-dev-principal": "..."}}
//   {"id": "...", "op": "reconnect", "url": "...", "headers": {...}}
//        what an agent does when its session is gone (the SDK does not do
//        it itself): close the Client (which sends no DELETE), then connect
//        a new Client and transport as connect does, with a new initialize
//   {"id": "...", "op": "list"}
//   {"id": "...", "op": "call", "name": "...", "arguments": {...}, "progress": true}
//   {"id": "...", "op": "stream", "name": "...", "arguments": {...}}
//        client.experimental.tasks.callToolStream, each message it yields
//   {"id": "...", "op": "close"}
//
// Any step may carry "timeout_ms" (default 20000). The answer to a step:
//
//   {"step": id, "op": op, "ok": bool,
//    "result": the CallToolResult as the SDK returned it (call),
//    "tools": [names] (list), "stream": [messages] (stream),
//    "error": {"class", "code", "message", "data"} (what the SDK threw),
//    "onerror_fired": whether Client.onerror or the transport's onerror
//                     fired during the step, "onerror": their messages,
//    "http": [{"method", "http_method", "status", "content_type"}], every HTTP
//            request the transport made during the step,
//    "started_at", "finished_at": ms since the epoch,
//    and for connect and reconnect: "sdk", "runtime", "protocol_version",
//    "session_id"}
//
// A call with "progress": true passes onprogress, and every notification it
// gets is printed as it arrives, before the step's answer:
//
//   {"event": "progress", "step": id, "t": ms since the epoch, "progress", "total", "message"}
//
// It exits when stdin ends or after close; anything unexpected is printed as
// {"event": "fatal", "message"} and exits 1.
import { createInterface } from 'node:readline';
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

// Not require('@modelcontextprotocol/sdk/package.json'): the package's
// exports map sends that to dist/cjs/package.json.
const sdkVersion = JSON.parse(readFileSync(new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8')).version;

const emit = obj => process.stdout.write(JSON.stringify(obj) + '\n');

function describeErr(e) {
  const d = { class: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e) };
  if (typeof e?.code === 'number') d.code = e.code;
  if (e?.data !== undefined) d.data = e.data;
  // A StreamableHTTPError carries the response body only as text at the
  // end of its message: what a caller could recover from it.
  const m = /(\{.*\})\s*$/s.exec(e?.message ?? '');
  if (m && e?.data === undefined) {
    try {
      const body = JSON.parse(m[1]);
      if (body?.error) d.body_error = body.error;
    } catch { /* not JSON */ }
  }
  return d;
}

// Per step: what the transport and the client reported outside the call.
let onerrors = [];
let http = [];

// Records every HTTP request the transport makes, with its JSON-RPC method.
async function recordingFetch(url, init) {
  const rec = { http_method: init?.method ?? 'GET' };
  if (typeof init?.body === 'string') {
    try {
      const msg = JSON.parse(init.body);
      rec.method = Array.isArray(msg) ? msg.map(m => m.method ?? 'response').join(',') : (msg.method ?? 'response');
    } catch { /* not JSON */ }
  }
  http.push(rec);
  const res = await fetch(url, init);
  rec.status = res.status;
  rec.content_type = res.headers.get('content-type') ?? '';
  return res;
}

let client;
let transport;

async function connect(step) {
  transport = new StreamableHTTPClientTransport(new URL(step.url), {
    requestInit: { headers: step.headers ?? {} },
    fetch: recordingFetch,
  });
  // step.elicitation_url: declare URL-mode elicitation; a denial's URL
  // elicitation comes as an error, answered out of band by the test.
  const options = step.elicitation_url ? { capabilities: { elicitation: { url: {} } } } : {};
  client = new Client({ name: 'capsnap-e2e-ts', version: '1' }, options);
  client.onerror = e => onerrors.push(`client: ${e?.message ?? e}`);
  await client.connect(transport, { timeout: step.timeout_ms ?? 20000 });
  // connect installs its own transport.onerror, which calls client.onerror;
  // wrap it to tell the two apart.
  const prev = transport.onerror;
  transport.onerror = e => { onerrors.push(`transport: ${e?.message ?? e}`); prev?.(e); };
  return { protocol_version: transport.protocolVersion, session_id: transport.sessionId };
}

async function run(step) {
  const timeout = step.timeout_ms ?? 20000;
  switch (step.op) {
    case 'reconnect':
      try {
        await client?.close();
      } catch (e) {
        onerrors.push(`close: ${e?.message ?? e}`);
      }
      client = undefined;
      // falls through: then a connect like any other
    case 'connect': {
      const out = { sdk: { name: '@modelcontextprotocol/sdk', version: sdkVersion }, runtime: `node ${process.version}` };
      try {
        return { ...out, ...(await connect(step)) };
      } catch (e) {
        client = undefined;
        return { ...out, error: describeErr(e) };
      }
    }
    case 'list': {
      const r = await client.listTools(undefined, { timeout });
      return { tools: r.tools.map(t => t.name) };
    }
    case 'call': {
      const opts = { timeout };
      if (step.progress) {
        opts.onprogress = p => emit({ event: 'progress', step: step.id, t: Date.now(), progress: p.progress, total: p.total, message: p.message });
        opts.resetTimeoutOnProgress = true;
      }
      return { result: await client.callTool({ name: step.name, arguments: step.arguments ?? {} }, undefined, opts) };
    }
    case 'stream': {
      if (typeof client.experimental?.tasks?.callToolStream !== 'function') {
        return { error: { class: 'unsupported', message: 'this SDK has no client.experimental.tasks.callToolStream' } };
      }
      const stream = [];
      let error;
      let result;
      for await (const m of client.experimental.tasks.callToolStream({ name: step.name, arguments: step.arguments ?? {} }, undefined, { timeout })) {
        if (m.type === 'error') {
          error = describeErr(m.error);
          stream.push({ type: 'error', error });
        } else if (m.type === 'result') {
          result = m.result;
          stream.push({ type: 'result', result });
        } else {
          stream.push({ type: m.type, task: m.task });
        }
      }
      return { stream, result, error };
    }
    case 'close':
      await client?.close();
      return {};
    default:
      return { error: { class: 'bad_step', message: `unknown op ${JSON.stringify(step.op)}` } };
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
try {
  for await (const line of lines) {
    if (!line.trim()) continue;
    const step = JSON.parse(line);
    onerrors = [];
    http = [];
    const started = Date.now();
    let out;
    try {
      if (!['connect', 'reconnect', 'close'].includes(step.op) && !client) {
        throw new Error('not connected');
      }
      out = await run(step);
    } catch (e) {
      out = { error: describeErr(e) };
    }
    const finished = Date.now();
    // Let an onerror that the same failure triggers be counted with it.
    await new Promise(r => setTimeout(r, 20));
    const ok = out.error === undefined;
    emit({
      step: step.id, op: step.op, ok, ...out,
      onerror_fired: onerrors.length > 0, onerror: onerrors, http,
      started_at: started, finished_at: finished,
    });
    if (step.op === 'close') break;
  }
} catch (e) {
  emit({ event: 'fatal', message: String(e?.stack ?? e) });
  process.exit(1);
}
process.exit(0);
