"""ASGI wrapper for what happens on the wire around a request, below the routes.

Two cases the HTTP server leaves to the application:

* A response sent before the request body was read (405 for `POST /health`, 413, 401,
  an early 400). The server can only start the connection's next request once the body
  has arrived, so without help a keep-alive connection is left waiting and the client's
  next request is never answered. Before the response's last byte the rest of the body is
  read and dropped; a body too large to be worth reading ends the connection instead, and
  the response says so with `Connection: close`.
* Any response's last message is sent shielded from the application's cancellation: the
  server may close the connection while sending it (the client asked to, or its request
  limit per connection is reached), and a cancelled close leaves the socket open.
* A WebSocket upgrade (`GET /health` with `Upgrade: websocket`). ds4d speaks no WebSocket;
  the request is answered as the plain HTTP request it also is, which is what HTTP asks
  of a server that ignores an upgrade.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import trio

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
# What `wrap` takes and gives: any ASGI application (frameworks type scopes and messages
# as their own TypedDicts, which these plain dicts stand for).
AnyApp = Callable[..., Awaitable[None]]

# Unread body a response may still wait for before its last byte; beyond this the
# connection is closed instead of read to the end.
DRAIN_MAX_BYTES = 16 << 20
# How long an answered request's remaining body may take to arrive.
DRAIN_TIMEOUT_S = 10.0


class _BodyTracker:
    """Watches the request's body messages as the application reads them."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._receive = receive
        self.done = trio.Event()
        self.received = 0
        self.expected: int | None = None
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    self.expected = int(value)
                except ValueError:
                    self.expected = None
        if scope.get("method") in ("GET", "HEAD") and self.expected in (None, 0):
            self.done.set()  # no body announced: nothing to wait for

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.done.set()
        elif message["type"] == "http.disconnect":
            self.done.set()
        return message

    @property
    def worth_draining(self) -> bool:
        if self.done.is_set():
            return True
        if self.expected is None:  # chunked: unknown length
            return False
        return self.expected - self.received <= DRAIN_MAX_BYTES

    async def drain(self) -> bool:
        """Read what is left of the body; True once it is all in. The application's
        own reader may still be running and take the last message itself, so this
        waits for the body to end, whoever reads it, rather than for its own read."""

        async def pull() -> None:
            while True:
                await self.receive()

        with trio.move_on_after(DRAIN_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pull)
                await self.done.wait()
                nursery.cancel_scope.cancel()
        return self.done.is_set()


def _http_scope_of(scope: Scope) -> Scope:
    http = dict(scope)
    http["type"] = "http"
    http["method"] = "GET"
    http["scheme"] = {"ws": "http", "wss": "https"}.get(scope.get("scheme", "ws"), "http")
    http["headers"] = [
        (k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"upgrade", b"connection")
    ]
    http.pop("subprotocols", None)
    return http


def wrap(app: AnyApp) -> Callable[..., Coroutine[Any, Any, None]]:
    async def wire(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await _http(app, scope, receive, send)
        elif scope["type"] == "websocket":
            await _websocket_as_http(app, scope, receive, send)
        else:
            await app(scope, receive, send)

    return wire


async def _http(app: App, scope: Scope, receive: Receive, send: Send) -> None:
    body = _BodyTracker(scope, receive)
    closing = False

    async def send_after_body(message: Message) -> None:
        nonlocal closing
        if message["type"] == "http.response.start" and not body.worth_draining:
            closing = True
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"connection", b"close")],
            }
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            if not closing and not body.done.is_set():
                await body.drain()
            # With this last message the server either readies the connection for the
            # next request or closes it (`Connection: close` from either side, an unread
            # body, its per-connection request limit). The application cancels its own
            # tasks as soon as the response is out, and a close cancelled halfway leaves
            # the socket open with nothing to answer on it: the client waits forever.
            # The server shields its own writes, so shielding this one adds no wait.
            with trio.CancelScope(shield=True):
                await send(message)
            return
        await send(message)

    await app(scope, body.receive, send_after_body)


async def _websocket_as_http(app: App, scope: Scope, receive: Receive, send: Send) -> None:
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1003})
        return
    sent_request = False

    async def http_receive() -> Message:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return {"type": "http.disconnect"}

    async def http_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            await send({**message, "type": "websocket.http.response.start"})
        elif message["type"] == "http.response.body":
            await send({**message, "type": "websocket.http.response.body"})

    await app(_http_scope_of(scope), http_receive, http_send)
