"""A small MCP server on the official Python SDK (``mcp``'s MCPServer over
streamable HTTP), guarded by capsnap's envelope verifier: a refund tool that
moves money and an order lookup, neither of which runs unless capsnap signed
an envelope for exactly that call.

    python example/server.py --addr 127.0.0.1:8081 --server-id billing \\
        --jwks-url http://127.0.0.1:9002/.well-known/jwks.json
    (or --jwks-file FILE, as `capsnap keys jwks --config FILE` prints it)
    [--grant-key grant-key.pem ...] [--list-ttl-ms N] [--mirror-order-id]

With --grant-key (repeatable: several during a rotation), it also takes
envelopes under a grant (docs/ENVELOPE.md, "Under a grant"): each FILE is a
P-256 private key, PEM PKCS #8, whose public half is this server's
servers[].grant_key_file in capsnap's configuration.

With --list-ttl-ms, its tools/list results tell 2026-07-28 clients they
may reuse them for that long (ttlMs, cacheScope "public"); without, the
SDK's default, 0: immediately stale.

With --mirror-order-id, lookup_order's order_id carries x-mcp-header
"Order": a 2026-07-28 client mirrors it in the Mcp-Param-Order header, and
the SDK holds that header to the body.

It serves MCP at /mcp: 2025-era sessions (a session begins with
initialize), and 2026-07-28 statelessly (server/discover, and
subscriptions/listen for list_changed). For the end-to-end tests
(e2e/envelope_sdk_test.go, e2e/rev2026_test.go) it also serves

    GET  /admin/stats    how often each handler started and each refusal
                         reason was given, and the variant served
    POST /admin/variant  body: a variant, "baseline" or "skip_fraud_check"
                         (refund takes an optional skip_fraud_check too);
                         redeploys refund as that variant, tells every
                         subscriptions/listen stream that asked for it
                         (notifications/tools/list_changed), and answers
                         the stats

as testbed/cmd/mcpfixture and the Go billing server do.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Literal

import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from capsnap_envelope import EnvelopeError, Verifier  # noqa: E402
from capsnap_envelope.mcp import guard  # noqa: E402


VARIANTS = ("baseline", "skip_fraud_check")
"""The contracts refund can be redeployed as; the first is served at start."""

Amount = Annotated[float, Field(gt=0, le=250, description="Amount in USD.")]
ReasonCode = Literal["duplicate_charge", "damaged", "not_received"]
MirroredOrderID = Annotated[str, Field(json_schema_extra={"x-mcp-header": "Order"})]


def build(
    server_id: str, verifier: Verifier, list_ttl_ms: int = 0, mirror_order_id: bool = False
) -> tuple[MCPServer, dict]:
    """The guarded server, and its stats."""
    stats = {"server_id": server_id, "variant": VARIANTS[0], "handler_starts": Counter(), "refusals": Counter()}
    bus = InMemorySubscriptionBus()
    hints = {"tools/list": CacheHint(ttl_ms=list_ttl_ms, scope="public")} if list_ttl_ms else None
    server = MCPServer(f"capsnap-example-{server_id}", subscriptions=bus, cache_hints=hints)

    def refund_as(variant: str) -> Callable[..., str]:
        """refund's handler, whose signature is the variant's contract."""
        if variant == "skip_fraud_check":

            def refund(
                order_id: str,
                amount: Amount,
                reason_code: ReasonCode,
                skip_fraud_check: Annotated[bool, Field(description="Skip the fraud check.")] = False,
            ) -> str:
                stats["handler_starts"]["refund"] += 1
                return f"refunded {amount:g} USD on {order_id} ({reason_code})"

            return refund

        def refund(order_id: str, amount: Amount, reason_code: ReasonCode) -> str:
            stats["handler_starts"]["refund"] += 1
            return f"refunded {amount:g} USD on {order_id} ({reason_code})"

        return refund

    def deploy(variant: str) -> None:
        server.add_tool(
            refund_as(variant),
            description="Refund part or all of an order's charge, in USD.",
            annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False),
        )
        stats["variant"] = variant

    deploy(VARIANTS[0])

    def lookup_order(order_id: str) -> str:
        stats["handler_starts"]["lookup_order"] += 1
        return f"order {order_id}: paid, 40 USD"

    def lookup_order_mirrored(order_id: MirroredOrderID) -> str:
        return lookup_order(order_id)

    server.add_tool(
        lookup_order_mirrored if mirror_order_id else lookup_order,
        name="lookup_order",
        description="Look an order up by its id.",
        annotations=ToolAnnotations(read_only_hint=True),
    )

    def refused(e: EnvelopeError, tool: str, request_id: object) -> None:
        stats["refusals"][e.reason] += 1
        print(f"refused {tool} (request {request_id!r}): {e}", file=sys.stderr, flush=True)

    guard(server, verifier, on_refusal=refused)

    @server.custom_route("/admin/stats", methods=["GET"])
    async def admin_stats(_: Request) -> JSONResponse:
        return JSONResponse(stats)

    @server.custom_route("/admin/variant", methods=["POST"])
    async def admin_variant(request: Request) -> JSONResponse | PlainTextResponse:
        variant = (await request.body()).decode(errors="replace").strip()
        if variant not in VARIANTS:
            return PlainTextResponse(f"unknown variant {variant!r} (want one of {', '.join(VARIANTS)})", status_code=400)
        if variant != stats["variant"]:
            server.remove_tool("refund")
            deploy(variant)
            await bus.publish(ToolsListChanged())
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
    p.add_argument("--list-ttl-ms", type=int, default=0, help="the ttlMs of tools/list results (2026-07-28)")
    p.add_argument(
        "--mirror-order-id", action="store_true", help="lookup_order's order_id mirrored in Mcp-Param-Order (2026-07-28)"
    )
    a = p.parse_args()
    host, _, port = a.addr.rpartition(":")
    verifier = Verifier(a.server_id, jwks_url=a.jwks_url, jwks_file=a.jwks_file, grant_key_files=a.grant_key)
    server, _ = build(a.server_id, verifier, a.list_ttl_ms, a.mirror_order_id)
    app = server.streamable_http_app(json_response=True, host=host or "127.0.0.1")
    print(
        f"capsnap example MCP server (Python SDK) {a.server_id} at http://{a.addr}/mcp, guarded by the envelope verifier",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
