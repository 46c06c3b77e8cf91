"""A small MCP server on the official Python SDK (``mcp``'s MCPServer over
streamable HTTP), guarded by capsnap's envelope verifier: a refund tool that
moves money and an order lookup, neither of which runs unless capsnap signed
an envelope for exactly that call.

    python example/server.py --addr 127.0.0.1:8081 --server-id billing \\
        --jwks-url http://127.0.0.1:9002/.well-known/jwks.json
    (or --jwks-file FILE, as `capsnap keys jwks --config FILE` prints it)
    [--grant-key grant-key.pem ...]

With --grant-key (repeatable: several during a rotation), it also takes
envelopes under a grant (docs/ENVELOPE.md, "Under a grant"): each FILE is a
P-256 private key, PEM PKCS #8, whose public half is this server's
servers[].grant_key_file in capsnap's configuration.

It serves MCP at /mcp (stateful: a session begins with initialize), and
GET /admin/stats: how often each handler started and each refusal reason
was given, for the end-to-end tests (e2e/envelope_sdk_test.go).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Annotated, Literal

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from capsnap_envelope import EnvelopeError, Verifier  # noqa: E402
from capsnap_envelope.mcp import guard  # noqa: E402


def build(server_id: str, verifier: Verifier) -> tuple[MCPServer, dict]:
    """The guarded server, and its stats."""
    stats = {"server_id": server_id, "handler_starts": Counter(), "refusals": Counter()}
    server = MCPServer(f"capsnap-example-{server_id}")

    @server.tool(
        description="Refund part or all of an order's charge, in USD.",
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False),
    )
    def refund(
        order_id: str,
        amount: Annotated[float, Field(gt=0, le=250, description="Amount in USD.")],
        reason_code: Literal["duplicate_charge", "damaged", "not_received"],
    ) -> str:
        stats["handler_starts"]["refund"] += 1
        return f"refunded {amount:g} USD on {order_id} ({reason_code})"

    @server.tool(description="Look an order up by its id.", annotations=ToolAnnotations(read_only_hint=True))
    def lookup_order(order_id: str) -> str:
        stats["handler_starts"]["lookup_order"] += 1
        return f"order {order_id}: paid, 40 USD"

    def refused(e: EnvelopeError, tool: str, request_id: object) -> None:
        stats["refusals"][e.reason] += 1
        print(f"refused {tool} (request {request_id!r}): {e}", file=sys.stderr, flush=True)

    guard(server, verifier, on_refusal=refused)

    @server.custom_route("/admin/stats", methods=["GET"])
    async def admin_stats(_: Request) -> JSONResponse:
        return JSONResponse(stats)

    return server, stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:8081")
    p.add_argument("--server-id", default="billing")
    p.add_argument("--jwks-url")
    p.add_argument("--jwks-file")
    p.add_argument(
        "--grant-key",
        action="append",
        default=[],
        metavar="FILE",
        help="a grant key (P-256 private key, PEM PKCS #8); repeatable",
    )
    a = p.parse_args()
    host, _, port = a.addr.rpartition(":")
    verifier = Verifier(a.server_id, jwks_url=a.jwks_url, jwks_file=a.jwks_file, grant_key_files=a.grant_key)
    server, _ = build(a.server_id, verifier)
    app = server.streamable_http_app(json_response=True, host=host or "127.0.0.1")
    print(
        f"capsnap example MCP server (Python SDK) {a.server_id} at http://{a.addr}/mcp, guarded by the envelope verifier",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
