"""The test agent's kube-proxy, as its own process.

``/svc/{service}/...`` goes to a ready endpoint of that Service (round robin), ``/pod/{name}/...``
to one pod's port. The agent writes the routing table (``{"services": {name: [port, ...]},
"pods": {name: port}}``) to a JSON file with an atomic rename whenever it changes; every request
rereads the file and reparses it when its content changed, so an endpoint update applies from
the next request on, as with kube-proxy.

Why a process and asyncio: the first proxy was a thread-per-connection server inside the test
process, where it shared one GIL with the API emulator and the agent. Under bursts of dozens of
concurrent requests it became the bottleneck, so the serving pods saw a trickle instead of the
burst and their batch-size estimates measured the proxy, not the load. Each request opens a
fresh upstream connection (no pooling): a request never rides a kept-alive connection to a pod
that has left the endpoints. ``X-`` headers pass through both ways (a pipeline router's
deadline to its stages, its ``X-Packrat-Path`` to the client).

Run: ``python kubeproxy.py --port PORT --table FILE``; it prints ``ready`` once listening and
exits when its parent process does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web


class Table:
    """The routing table file, reparsed when its content changes (it is small: reading it per
    request costs microseconds, and unlike a stat key it cannot miss a quick rewrite)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw: bytes | None = None
        self.services: dict[str, list[int]] = {}
        self.pods: dict[str, int] = {}

    def refresh(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        if raw == self._raw:
            return
        doc: dict[str, Any] = json.loads(raw)
        self.services = {k: [int(p) for p in v] for k, v in doc.get("services", {}).items()}
        self.pods = {k: int(v) for k, v in doc.get("pods", {}).items()}
        self._raw = raw


def _extension_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``X-`` headers, passed through both ways (an L4 kube-proxy passes every byte; the
    rest are rebuilt per hop: Content-Type above, lengths and connection by aiohttp)."""
    return {k: v for k, v in headers.items() if k.lower().startswith("x-")}


def make_app(table: Table) -> web.Application:
    rr = itertools.count()
    app = web.Application(client_max_size=64 * 2**20)

    async def session_ctx(app: web.Application) -> Any:
        # force_close: one upstream connection per request, like the first proxy
        session = ClientSession(
            connector=TCPConnector(limit=0, force_close=True), timeout=ClientTimeout(total=60)
        )
        app["session"] = session
        yield
        await session.close()

    app.cleanup_ctx.append(session_ctx)

    async def forward(request: web.Request) -> web.StreamResponse:
        kind, name = request.match_info["kind"], request.match_info["name"]
        rest = request.match_info.get("rest", "")
        table.refresh()
        if kind == "pod":
            port = table.pods.get(name)
            ports = [port] if port else []
        else:
            ports = table.services.get(name) or []
        if not ports:
            return web.json_response({"error": "no endpoints"}, status=503)
        port = ports[next(rr) % len(ports)]
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        headers.update(_extension_headers(request.headers))  # deadlines, as kube-proxy does
        if "Authorization" in request.headers:  # the operator's in-pod switch (bearer token)
            headers["Authorization"] = request.headers["Authorization"]
        # the query too, as kube-proxy passes every byte (without it the operator's
        # ``/arrivals?after=`` read every pod's whole log, every pass)
        url = f"http://127.0.0.1:{port}/{rest}"
        if request.query_string:
            url += f"?{request.query_string}"
        try:
            async with app["session"].request(
                request.method, url, data=body or None, headers=headers
            ) as resp:
                data = await resp.read()
                return web.Response(
                    status=resp.status,
                    body=data,
                    content_type=(resp.content_type or "text/plain"),
                    headers=_extension_headers(resp.headers),  # X-Packrat-Path
                )
        except (TimeoutError, ClientError, OSError) as exc:
            return web.Response(status=502, text=f"endpoint {port}: {exc!r}")

    app.router.add_route("*", "/{kind:svc|pod}/{name}", forward)
    app.router.add_route("*", "/{kind:svc|pod}/{name}/{rest:.*}", forward)
    return app


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--table", type=Path, required=True)
    args = parser.parse_args(argv)
    runner = web.AppRunner(make_app(Table(args.table)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
    await site.start()
    print("ready", flush=True)
    parent = os.getppid()
    try:
        # exit with the test process, even when it dies without stopping us (no orphan left
        # holding the CI job's output open)
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
