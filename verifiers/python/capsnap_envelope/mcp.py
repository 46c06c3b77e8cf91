"""Guards an MCP server on the ``mcp`` SDK (2.x; tested at 2.3.0) with a verifier.

Every ``tools/call`` is checked before the SDK validates its parameters and
dispatches it to the tool function, and refused with JSON-RPC error -31000
and ``data.reason`` unless it carries an envelope capsnap signed for
exactly this call, to this server, against the definition this server
lists for the tool.

The check is a server middleware (``MCPServer.middleware``, the same list
as the low-level ``Server.middleware``): it runs on every inbound request
after its context is built and before validation, with the request as it
arrived: ``ctx.method``, the raw ``ctx.params`` (the tool's name and
arguments as sent, not as a tool function's pydantic model coerced them),
``ctx.request_id`` (the JSON-RPC id) and ``ctx.request``, the Starlette
request whose headers carry the envelope (``x-capsnap-envelope``) and the
grant it is under, if any (``x-capsnap-grant``), on the HTTP transports. An
``MCPError`` raised there becomes the JSON-RPC error response.

    from mcp.server.mcpserver import MCPServer
    from capsnap_envelope import Verifier
    from capsnap_envelope.mcp import guard

    server = MCPServer("billing")
    ...  # @server.tool() functions
    guard(server, Verifier(
        "billing",
        jwks_url="http://capsnap-admin:9002/.well-known/jwks.json",
        grant_key_files=["/etc/billing/grant-key.pem"],  # if capsnap has its public half
    ))
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio.to_thread
from mcp.shared.exceptions import MCPError

from . import CODE_REFUSED, GRANT_HEADER, HEADER, Call, EnvelopeError, Verifier, tool_digest

__all__ = ["EnvelopeGuard", "guard"]

Definitions = Callable[[Any], Awaitable[Sequence[Mapping[str, Any]]]]
"""Returns the server's tool definitions as it lists them (wire JSON objects), given the request context."""


class EnvelopeGuard:
    """Server middleware that refuses every ``tools/call`` without its envelope.

    ``definitions`` returns the tool definitions this server lists, as JSON
    objects: the schema digest compared is that of the called tool's entry,
    taken at each call, so that a redeploy that changed the definition (or
    a tool capsnap never listed) is refused as ``handler_drift``.
    ``on_refusal`` is told of each refusal (to log or count it).
    """

    def __init__(
        self,
        verifier: Verifier,
        definitions: Definitions,
        *,
        on_refusal: Callable[[EnvelopeError, str, Any], None] | None = None,
    ) -> None:
        self.verifier = verifier
        self.definitions = definitions
        self.on_refusal = on_refusal

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        tool = params.get("name") if isinstance(params.get("name"), str) else ""
        arguments = params.get("arguments")
        headers = getattr(ctx.request, "headers", None)
        token, grant = _header(headers, HEADER), _header(headers, GRANT_HEADER)
        try:
            own = None
            for d in await self.definitions(ctx):
                if d.get("name") == tool:
                    own = tool_digest(d)
            call = Call(
                tool=tool,
                arguments=arguments,
                request_id=ctx.request_id,
                schema_digest=own if own is not None else f"(this server lists no tool {tool!r})",
            )
            verify = functools.partial(self.verifier.verify, token, call, grant=grant)
            if self.verifier.jwks_url is not None:
                # A JWKS fetch blocks; keep it off the event loop.
                await anyio.to_thread.run_sync(verify)
            else:
                verify()
        except EnvelopeError as e:
            if self.on_refusal is not None:
                try:
                    self.on_refusal(e, tool, ctx.request_id)
                except Exception:  # a hook cannot change the answer
                    pass
            raise MCPError(
                code=CODE_REFUSED,
                message=f"tool {tool!r} refused at handler start: {e}",
                data={"reason": e.reason, "detail": e.detail, "tool": tool},
            ) from None
        return await call_next(ctx)


def _header(headers: Any, name: str) -> str | None:
    """The request header ``name``; several of it are joined, as one that does not verify."""
    if headers is None:
        return None
    values = headers.getlist(name) if hasattr(headers, "getlist") else [headers.get(name)]
    values = [v for v in values if v is not None]
    return ", ".join(values) if values else None


def guard(
    server: Any,
    verifier: Verifier,
    *,
    on_refusal: Callable[[EnvelopeError, str, Any], None] | None = None,
) -> EnvelopeGuard:
    """Guards every tool of ``server``, an ``MCPServer``; returns the middleware.

    The tool definitions are the server's own listing, ``MCPServer.list_tools()``,
    serialized as the SDK puts them on the wire. (On a low-level ``Server``,
    append an :class:`EnvelopeGuard` to ``server.middleware`` with a
    ``definitions`` callable of your own.)
    """
    if hasattr(server, "list_tools") and hasattr(server, "middleware"):

        async def definitions(_: Any) -> Sequence[Mapping[str, Any]]:
            return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in await server.list_tools()]

    else:
        raise TypeError("capsnap envelope: guard() takes an mcp MCPServer")
    g = EnvelopeGuard(verifier, definitions, on_refusal=on_refusal)
    server.middleware.append(g)
    return g

