"""An agent runner on the official Python MCP SDK (mcp, pinned in
requirements.txt and constraints.txt), for capsnap's end-to-end tests
(e2e/sdk_test.go).

    python client.py

It speaks the same protocol as ../ts/client.mjs: steps on stdin, one JSON
object a line, run in turn on one session, each answered with one JSON line
on stdout, so that the test can act between steps while the session stays
open. Steps:

    {"id": "...", "op": "connect", "url": "...", "headers": {...}, "api": "session"}
        api "session" (the default): ClientSession over
        streamable_http_client, then session.initialize() (2025-11-25);
        api "client": mcp.Client over the same transport, in its default
        mode "auto" (server/discover at 2026-07-28, else initialize).
    {"id": "...", "op": "reconnect", "url": "...", "headers": {...}, "api": "session"}
        what an agent does when its session is gone (the SDK does not do
        it itself): close the session, its transport and HTTP client (the
        transport sends a DELETE for the old session; what that logs is
        reported in "onerror"), then connect anew as connect does
    {"id": "...", "op": "list"}
    {"id": "...", "op": "call", "name": "...", "arguments": {...}, "progress": true}
    {"id": "...", "op": "listen"}
        api "client" at 2026-07-28: Client.listen(tools_list_changed=True),
        a subscriptions/listen stream that stays open across the steps
        that follow; answered once the server acknowledged it
    {"id": "...", "op": "next_event"}
        the next change event on that stream (the Client evicts its
        cached tools/list as it hands the event over)
    {"id": "...", "op": "stream", ...}   unsupported: no such API in this SDK
    {"id": "...", "op": "close"}

Any step may carry "timeout_ms" (default 20000). The answer to a step:

    {"step": id, "op": op, "ok": bool,
     "result": the CallToolResult as JSON, by its wire names (call),
     "tools": [names] (list),
     "honored": the filter the server acknowledged, "subscription_id" (listen),
     "change": the event's class, such as "ToolsListChanged" (next_event),
     "error": {"class", "code", "message", "data"} (what the SDK raised; an
              exception group's members under "sub"),
     "onerror_fired": whether the SDK reported anything out of band during
                      the step (a log record at WARNING or above, or an
                      exception handed to message_handler), "onerror": them,
     "http": [{"method", "http_method", "status", "content_type"}], every
             HTTP request the transport made during the step: call_tool
             lists the tools itself when it has not seen the tool's
             outputSchema, and this shows it,
     "started_at", "finished_at": ms since the epoch,
     and for connect and reconnect: "sdk", "runtime", "protocol_version",
     "session_id"}

A call with "progress": true passes progress_callback, and every
notification it gets is printed as it arrives, before the step's answer:

    {"event": "progress", "step": id, "t": ms, "progress", "total", "message"}

It exits when stdin ends or after close; anything unexpected is printed as
{"event": "fatal", "message"} and exits 1.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
import traceback
from contextlib import AsyncExitStack
from importlib.metadata import version
from typing import Any

import anyio
import httpx2

import mcp_types
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import URL_ELICITATION_REQUIRED


def now_ms() -> float:
    return time.time() * 1000


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def describe_err(e: BaseException) -> dict[str, Any]:
    d: dict[str, Any] = {"class": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)[:2000]}
    if isinstance(e, MCPError):
        d.update(code=e.error.code, message=e.error.message)
        if e.error.data is not None:
            d["data"] = e.error.data
        # The client raises a -32042 as a plain MCPError; an agent reads it
        # with UrlElicitationRequiredError.from_error, which validates it.
        if e.error.code == URL_ELICITATION_REQUIRED:
            try:
                u = UrlElicitationRequiredError.from_error(e.error)
                d["url_elicitations"] = [x.model_dump(by_alias=True, exclude_none=True) for x in u.elicitations]
            except Exception as err:  # noqa: BLE001 - reported, the test fails on it
                d["url_elicitations_error"] = f"{type(err).__name__}: {err}"[:500]
    if isinstance(e, BaseExceptionGroup):
        d["sub"] = [describe_err(x) for x in e.exceptions]
    return d


class Runner:
    def __init__(self) -> None:
        self.stack = AsyncExitStack()
        self.session: Any = None  # ClientSession or Client: the same call_tool/list_tools
        self.transport_session_id: Any = None
        self.onerror: list[str] = []
        self.http: list[dict[str, Any]] = []
        # step elicitation_approve: {url, token} of the approval API, with
        # which elicit plays the person; elicited are the elicitations seen.
        self.approver: dict[str, str] | None = None
        self.elicited: list[dict[str, Any]] = []
        # step listen: the open subscriptions/listen stream.
        self.subscription: Any = None

    async def on_request(self, request: httpx2.Request) -> None:
        rec: dict[str, Any] = {"http_method": request.method}
        try:
            msg = json.loads(request.content or b"null")
            if isinstance(msg, list):
                rec["method"] = ",".join(m.get("method", "response") for m in msg)
            elif isinstance(msg, dict):
                rec["method"] = msg.get("method", "response")
        except (ValueError, httpx2.RequestNotRead):
            pass
        request.extensions["capsnap_record"] = rec
        self.http.append(rec)

    async def on_response(self, response: httpx2.Response) -> None:
        rec = response.request.extensions.get("capsnap_record")
        if rec is not None:
            rec["status"] = response.status_code
            rec["content_type"] = response.headers.get("content-type", "")
        sid = response.headers.get("mcp-session-id")
        if sid:
            self.transport_session_id = sid

    async def message_handler(self, msg: Any) -> None:
        if isinstance(msg, Exception):
            self.onerror.append(f"message_handler: {type(msg).__name__}: {msg}"[:500])

    async def elicit(self, context: Any, params: Any) -> Any:
        """Declines, unless the step said to play the person: then it records
        the URL it was asked to open, approves there through the approval
        API with the step's token, and accepts, as an application would once
        its user is back."""
        url = getattr(params, "url", None)
        self.elicited.append({"mode": getattr(params, "mode", None), "url": url, "message": getattr(params, "message", None)})
        approver = self.approver
        if not approver or not url or not url.startswith(approver["url"] + "/approvals/"):
            return mcp_types.ElicitResult(action="decline")
        request_id = url[len(approver["url"] + "/approvals/"):]
        async with httpx2.AsyncClient(timeout=10) as c:
            r = await c.post(f"{approver['url']}/api/approvals/{request_id}/approve",
                             headers={"Authorization": f"Bearer {approver['token']}"}, json={"reason": "approved in the elicitation"})
            self.elicited[-1]["approved"] = r.status_code
        return mcp_types.ElicitResult(action="accept")

    async def connect(self, step: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sdk": {"name": "mcp", "version": version("mcp"), "mcp-types": version("mcp-types")},
            "runtime": f"{platform.python_implementation()} {platform.python_version()}",
        }
        timeout_s = step.get("timeout_ms", 20000) / 1000
        http_client = httpx2.AsyncClient(
            headers=step.get("headers") or {},
            timeout=httpx2.Timeout(30, read=300),
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )
        await self.stack.enter_async_context(http_client)
        transport = streamable_http_client(step["url"], http_client=http_client)
        api = step.get("api", "session")
        out["api"] = api
        # No deadline of its own here: a cancel scope must not end while the
        # task groups entered in it live on. read_timeout_seconds bounds each
        # request, and the test bounds the process.
        # step elicitation_url: declare elicitation (form and URL modes, as
        # this SDK declares it with a callback); the callback is never asked
        # here, a denial's URL elicitation comes as an error.
        extra: dict[str, Any] = {}
        if step.get("elicitation_url"):
            extra["elicitation_callback"] = self.elicit
            self.approver = step.get("elicitation_approve")
        try:
            if api == "client":
                client = Client(transport, message_handler=self.message_handler, read_timeout_seconds=timeout_s, **extra)
                self.session = await self.stack.enter_async_context(client)
                out["protocol_version"] = client.protocol_version
            else:
                read, write = await self.stack.enter_async_context(transport)
                session = ClientSession(read, write, message_handler=self.message_handler, read_timeout_seconds=timeout_s, **extra)
                await self.stack.enter_async_context(session)
                res = await session.initialize()
                self.session = session
                out["protocol_version"] = res.protocol_version
        except BaseException as e:  # noqa: BLE001 - what surfaces is the point
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise
            self.session = None
            out["error"] = describe_err(e)
        out["session_id"] = self.transport_session_id
        return out

    async def disconnect(self) -> None:
        """Closes the session and everything connect entered for it."""
        stack, self.stack, self.session, self.subscription = self.stack, AsyncExitStack(), None, None
        # No deadline of its own (as in connect): the scopes the stack
        # entered must close in the order they were entered, so none can
        # open around them here. The test bounds the step.
        try:
            await stack.aclose()
        except BaseException as e:  # noqa: BLE001 - reported, not fatal
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise
            self.onerror.append(f"close: {type(e).__name__}: {e}"[:500])
        # After the close: its DELETE's answer goes through on_response too.
        self.transport_session_id = None

    async def run(self, step: dict[str, Any]) -> dict[str, Any]:
        op = step.get("op")
        timeout_s = step.get("timeout_ms", 20000) / 1000
        if op == "connect":
            return await self.connect(step)
        if op == "reconnect":
            await self.disconnect()
            return await self.connect(step)
        if op == "close":
            return {}
        if op == "stream":
            return {"error": {"class": "unsupported", "message": "the Python SDK has no streaming tool-call API"}}
        if self.session is None:
            return {"error": {"class": "not_connected", "message": "not connected"}}
        self.elicited = []
        try:
            with anyio.fail_after(timeout_s + 5):
                if op == "list":
                    r = await self.session.list_tools()
                    return {"tools": [t.name for t in r.tools]}
                if op == "listen":
                    sub = await self.stack.enter_async_context(self.session.listen(tools_list_changed=True))
                    self.subscription = sub
                    return {"honored": sub.honored.model_dump(by_alias=True, exclude_none=True), "subscription_id": sub.subscription_id}
                if op == "next_event":
                    if self.subscription is None:
                        return {"error": {"class": "not_listening", "message": "no listen step before"}}
                    event = await anext(self.subscription)
                    return {"change": type(event).__name__}
                if op == "call":
                    kw: dict[str, Any] = {"read_timeout_seconds": timeout_s}
                    if step.get("progress"):
                        sid = step.get("id")

                        async def progress(p: float, total: float | None, message: str | None) -> None:
                            emit({"event": "progress", "step": sid, "t": now_ms(), "progress": p, "total": total, "message": message})

                        kw["progress_callback"] = progress
                    r = await self.session.call_tool(step["name"], step.get("arguments") or {}, **kw)
                    out = {"result": r.model_dump(by_alias=True, mode="json", exclude_none=True)}
                    if self.elicited:
                        out["elicited"] = self.elicited
                    return out
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise
            out = {"error": describe_err(e)}
            if self.elicited:
                out["elicited"] = self.elicited
            return out
        return {"error": {"class": "bad_step", "message": f"unknown op {op!r}"}}


class _Capture(logging.Handler):
    def __init__(self, runner: Runner) -> None:
        super().__init__(level=logging.WARNING)
        self.runner = runner

    def emit(self, record: logging.LogRecord) -> None:
        self.runner.onerror.append(f"log {record.levelname} {record.name}: {record.getMessage()}"[:500])


async def main() -> None:
    r = Runner()
    logging.getLogger().addHandler(_Capture(r))
    logging.getLogger().setLevel(logging.WARNING)
    try:
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                break
            if not line.strip():
                continue
            step = json.loads(line)
            r.onerror, r.http = [], []
            started = now_ms()
            out = await r.run(step)
            finished = now_ms()
            await anyio.sleep(0.02)  # let what the same failure logs be counted with it
            emit(
                {
                    "step": step.get("id"),
                    "op": step.get("op"),
                    "ok": "error" not in out,
                    **out,
                    "onerror_fired": bool(r.onerror),
                    "onerror": r.onerror,
                    "http": r.http,
                    "started_at": started,
                    "finished_at": finished,
                }
            )
            if step.get("op") == "close":
                break
    finally:
        # Closing a session whose connect failed can raise again: that was
        # reported with the connect step.
        try:
            with anyio.move_on_after(10):
                await r.stack.aclose()
        except BaseException:  # noqa: BLE001
            pass


if __name__ == "__main__":
    try:
        anyio.run(main)
    except BaseException:  # noqa: BLE001
        emit({"event": "fatal", "message": traceback.format_exc()})
        sys.exit(1)
    sys.exit(0)
