"""guard() on a real MCPServer of the pinned SDK over streamable HTTP (the
example server, as its own process): a call with capsnap's envelope for
exactly it runs its handler, whether signed whole or under a grant (the
server holds grant-key-a.pem); every other call is refused with JSON-RPC
error -31000 and data.reason before the handler starts."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from capsnap_envelope import args_digest, tool_digest  # noqa: E402
from support import GOLDEN_JWKS, GRANT_KEY_A, GoldenKey, GrantRecipient, golden_claims, make_grant  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "example", "server.py")
A, B = GoldenKey("key-a.pem"), GoldenKey("key-b.pem")
BILLING, PAYMENTS = GrantRecipient("grant-key-a.pub.pem"), GrantRecipient("grant-key-b.pub.pem")
REFUND = {"order_id": "A-100", "amount": 40, "reason_code": "duplicate_charge"}
ids = itertools.count(100)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The example server, run as `python example/server.py` against the golden JWKS and grant key."""

    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [sys.executable, EXAMPLE, "--addr", self.url[len("http://") :], "--server-id", "billing", "--jwks-file", GOLDEN_JWKS,
             "--grant-key", GRANT_KEY_A],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                self.stats()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"the example server did not start:\n{self.output()}") from None
                time.sleep(0.05)

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url + "/admin/stats", timeout=5) as r:
            return json.load(r)

    def starts(self, tool: str) -> int:
        return self.stats()["handler_starts"].get(tool, 0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return self.proc.stdout.read().decode(errors="replace") if self.proc.stdout else ""


class Session:
    """A client session speaking JSON-RPC over plain HTTP, so that the test chooses every header and id."""

    def __init__(self, url: str) -> None:
        self.url, self.sid = url + "/mcp", None
        res, headers = self.post(
            {
                "jsonrpc": "2.0", "id": next(ids), "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
            }
        )  # fmt: skip
        assert "result" in res, res
        self.sid = headers["mcp-session-id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, body: dict, headers: dict | None = None) -> tuple[dict | None, dict]:
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream", **(headers or {})}
        if self.sid:
            h |= {"mcp-session-id": self.sid, "mcp-protocol-version": "2025-11-25"}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                return (json.loads(data) if data else None), dict(r.headers)
        except urllib.error.HTTPError as e:
            data = e.read()
            return (json.loads(data) if data else None), dict(e.headers)

    def rpc(self, method: str, params: dict, headers: dict | None = None, id: int | None = None) -> dict:
        return self.post({"jsonrpc": "2.0", "id": next(ids) if id is None else id, "method": method, "params": params}, headers)[0]

    def definition(self, tool: str) -> dict | None:
        return next((t for t in self.rpc("tools/list", {})["result"]["tools"] if t["name"] == tool), None)


class GuardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.srv = Server()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.srv.close()

    def envelope(self, s: Session, *, id, tool="refund", args=REFUND, key=A, edit=None) -> str:
        """The envelope capsnap would sign for this call, now, with edits."""
        d = s.definition(tool)
        now = int(time.time())
        c = {
            **golden_claims(), "iat": now, "exp": now + 30, "jti": f"jti-{next(ids)}", "tool": tool,
            "schema_digest": tool_digest(d) if d else "sha256:" + "0" * 64, "args_digest": args_digest(args), "rid": id,
        }  # fmt: skip
        if edit:
            edit(c)
        return key.seal(c)

    def refused(self, s: Session, *, tool="refund", args=REFUND, id=None, headers=None) -> str:
        id = next(ids) if id is None else id
        before = self.srv.starts(tool)
        msg = s.rpc("tools/call", {"name": tool, "arguments": args}, headers, id)
        self.assertEqual(self.srv.starts(tool), before, "the handler started")
        self.assertIn("error", msg, msg)
        self.assertEqual(msg["error"]["code"], -31000, msg)
        self.assertEqual(msg["id"], id)
        return msg["error"]["data"]["reason"]

    def test_a_call_with_its_envelope_runs_the_handler(self):
        s = Session(self.srv.url)
        id = next(ids)
        before = self.srv.starts("refund")
        msg = s.rpc("tools/call", {"name": "refund", "arguments": REFUND}, {"x-capsnap-envelope": self.envelope(s, id=id)}, id)
        self.assertNotIn("error", msg, msg)
        self.assertFalse(msg["result"].get("isError"), msg)
        self.assertIn("refunded 40 USD on A-100", msg["result"]["content"][0]["text"])
        self.assertEqual(self.srv.starts("refund"), before + 1)

    def test_refusals_before_the_handler_starts(self):
        s = Session(self.srv.url)
        env = "x-capsnap-envelope"
        # Forged capsnap headers, as a request that bypassed Envoy could write them, and no envelope.
        forged = {"x-capsnap-schema-digest": "sha256:" + "a" * 64, "x-capsnap-epoch": "ep_forged", "x-capsnap-principal": "spiffe://acme/agent/support-refund"}
        self.assertEqual(self.refused(s, headers=forged), "envelope_missing")
        # Replayed, with other arguments.
        i = next(ids)
        used = self.envelope(s, id=i)
        self.assertNotIn("error", s.rpc("tools/call", {"name": "refund", "arguments": REFUND}, {env: used}, i))
        self.assertEqual(self.refused(s, id=i, args={**REFUND, "amount": 250}, headers={env: used}), "envelope_mismatch")
        self.assertEqual(self.refused(s, id=i, headers={env: used}), "envelope_replayed")
        # For another request of the session.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i + 1000, headers={env: self.envelope(s, id=i)}), "envelope_mismatch")
        # For another tool.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, tool="lookup_order", args={"order_id": "A-100"}, headers={env: self.envelope(s, id=i)}), "envelope_mismatch")

        def expire(c):
            c["iat"], c["exp"] = c["iat"] - 120, c["iat"] - 60

        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: self.envelope(s, id=i, edit=expire)}), "envelope_expired")
        # Signed by a key capsnap does not publish.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: self.envelope(s, id=i, key=B)}), "envelope_invalid")
        # For another server.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: self.envelope(s, id=i, edit=lambda c: c.update(aud="payments"))}), "envelope_foreign")
        # Authorized against another definition of the tool.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: self.envelope(s, id=i, edit=lambda c: c.update(schema_digest="sha256:" + "b" * 64))}), "handler_drift")
        # For a tool this server does not list.
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, tool="wire_transfer", args={}, headers={env: self.envelope(s, id=i, tool="wire_transfer", args={})}), "handler_drift")
        self.assertGreaterEqual(self.srv.stats()["refusals"]["envelope_missing"], 1)

    def test_calls_under_a_grant(self):
        s = Session(self.srv.url)
        env, grant = "x-capsnap-envelope", "x-capsnap-grant"
        now = int(time.time())

        own = tool_digest(s.definition("refund"))

        def granted(to=BILLING, **edits):
            return make_grant(A, to, lambda c: c.update({"iat": now, "exp": now + 300, "schema_digest": own, **edits}))

        def call(g, id, args=REFUND):
            return g.seal({"iat": now, "exp": now + 30, "jti": f"jti-{next(ids)}", "args_digest": args_digest(args), "rid": id})

        g = granted()
        before = self.srv.starts("refund")
        used = None
        for _ in range(2):  # one grant, two calls
            i = next(ids)
            used = call(g, i)
            msg = s.rpc("tools/call", {"name": "refund", "arguments": REFUND}, {env: used, grant: g.token}, i)
            self.assertNotIn("error", msg, msg)
            self.assertIn("refunded 40 USD on A-100", msg["result"]["content"][0]["text"])
        self.assertEqual(self.srv.starts("refund"), before + 2)
        self.assertEqual(self.refused(s, id=i, headers={env: used, grant: g.token}), "envelope_replayed")
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, args={**REFUND, "amount": 250}, headers={env: call(g, i), grant: g.token}), "envelope_mismatch")
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: call(g, i)}), "envelope_invalid")  # the grant missing
        self.assertEqual(self.refused(s, headers={grant: g.token}), "envelope_missing")
        i = next(ids)
        self.assertEqual(self.refused(s, id=i, headers={env: call(g, i), grant: granted().token}), "envelope_invalid")  # another grant
        i = next(ids)
        other = granted(to=PAYMENTS)  # the call key encrypted to another server
        self.assertEqual(self.refused(s, id=i, headers={env: call(other, i), grant: other.token}), "envelope_invalid")
        i = next(ids)
        foreign = granted(aud="payments")
        self.assertEqual(self.refused(s, id=i, headers={env: call(foreign, i), grant: foreign.token}), "envelope_foreign")
        i = next(ids)
        drift = granted(schema_digest="sha256:" + "b" * 64)
        self.assertEqual(self.refused(s, id=i, headers={env: call(drift, i), grant: drift.token}), "handler_drift")

    def test_a_refusal_is_a_jsonrpc_error_with_the_documented_data(self):
        s = Session(self.srv.url)
        msg = s.rpc("tools/call", {"name": "refund", "arguments": REFUND})
        self.assertEqual(msg["error"]["code"], -31000)
        self.assertEqual(msg["error"]["data"]["reason"], "envelope_missing")
        self.assertEqual(msg["error"]["data"]["tool"], "refund")
        self.assertIn("x-capsnap-envelope", msg["error"]["data"]["detail"])

    def test_other_methods_are_not_guarded(self):
        s = Session(self.srv.url)
        self.assertEqual([t["name"] for t in s.rpc("tools/list", {})["result"]["tools"]], ["refund", "lookup_order"])


class RedeployTest(unittest.TestCase):
    """POST /admin/variant, on a server of its own: refund's contract changes, and a
    2026-07-28 subscriptions/listen stream is told (notifications/tools/list_changed)."""

    def setUp(self) -> None:
        self.srv = Server()
        self.addCleanup(self.srv.close)

    def deploy(self, variant: str) -> tuple[int, str]:
        req = urllib.request.Request(self.srv.url + "/admin/variant", data=variant.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def test_a_redeploy_changes_refund_and_tells_listeners(self):
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {"notifications": {"toolsListChanged": True}, "_meta": meta}}
        req = urllib.request.Request(
            self.srv.url + "/mcp",
            data=json.dumps(body).encode(),
            headers={
                "content-type": "application/json", "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28", "mcp-method": "subscriptions/listen",
            },
            method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as stream:

            def next_method() -> str:
                for line in stream:
                    if line.startswith(b"data:"):
                        return json.loads(line[len(b"data:") :])["method"]
                return "(the stream ended)"

            self.assertEqual(next_method(), "notifications/subscriptions/acknowledged")
            status, text = self.deploy("skip_fraud_check")
            self.assertEqual((status, json.loads(text)["variant"]), (200, "skip_fraud_check"), text)
            self.assertEqual(next_method(), "notifications/tools/list_changed")
        props = Session(self.srv.url).definition("refund")["inputSchema"]["properties"]
        self.assertIn("skip_fraud_check", props)
        status, text = self.deploy("wire_everything")
        self.assertEqual(status, 400, text)
        self.assertEqual(self.deploy("baseline")[0], 200)
        self.assertNotIn("skip_fraud_check", Session(self.srv.url).definition("refund")["inputSchema"]["properties"])


if __name__ == "__main__":
    unittest.main()
