"""The API server's routes (the ``vllm.endpoint_plugins`` entry point,
:class:`StatusEndpoint`): ``GET /stepscope/status`` and ``GET /stepscope/timeline?since=N`` ask
every engine worker (``collective_rpc``, to ``stepscope.vllm.rpc``'s handlers), ``GET
/stepscope/requests?since=N`` every engine core (``stepscope.vllm.lifecycles``); each route is
made by one function, with the server's API key checked as vLLM's ``/v1`` routes check it."""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any, Callable


class NoEngine(Exception):
    """The server has no engine (core) to ask: a 503."""


def api_tokens(args: Any) -> list[bytes]:
    """The SHA-256 digests of the API keys the server was started with, as vLLM reads them:
    ``--api-key`` (one or several), else ``VLLM_API_KEY``; empty when it has none."""
    keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
    if isinstance(keys, str):
        keys = [keys]
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


def authorized(tokens: list[bytes], authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries one of the keys (``Bearer KEY``, compared
    in constant time, as vLLM's own middleware does); always true for a server without keys."""
    if not tokens:
        return True
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(key.encode()).digest()
    match = False
    for token in tokens:
        match |= secrets.compare_digest(digest, token)
    return match


async def _status(state: Any, since: int) -> dict[str, Any]:
    engine = getattr(state, "stepscope_engine_client", None)
    if engine is None:
        raise NoEngine("this server has no engine")
    from stepscope.vllm.otel import status

    workers = list(await engine.collective_rpc("stepscope_status"))
    return {"workers": workers, "otel": status()}


async def _timeline(state: Any, since: int) -> dict[str, Any]:
    engine = getattr(state, "stepscope_engine_client", None)
    if engine is None:
        raise NoEngine("this server has no engine")
    return {"workers": list(await engine.collective_rpc("stepscope_timeline", args=(since,)))}


async def _requests(state: Any, since: int) -> str:
    engine = getattr(state, "stepscope_engine_client", None)
    core = getattr(engine, "engine_core", None)
    if core is None:
        raise NoEngine("this server has no engine core")
    every = getattr(core, "call_utility_all_async", None)
    if every is not None:
        answers = await every("stepscope_requests", since)
    else:
        answers = [await core.call_utility_async("stepscope_requests", since)]
    # Each engine core's answer is its log as JSON text (megabytes at the default sizes):
    # joined as it is, not parsed and written again on the server's event loop.
    return '{"engines": [' + ",".join(str(a) for a in answers) + "]}"


class StatusEndpoint:
    """The ``vllm.endpoint_plugins`` entry point: ``GET /stepscope/status`` on the API server,
    answering ``{"workers": [status, ...]}`` from every engine worker (through vLLM's
    ``collective_rpc``, to the method the general plugin installs).

    The routes answer what a server's operators see (its workers' state, steps and timings),
    so on a server started with ``--api-key`` (or ``VLLM_API_KEY``) they require the key as
    vLLM's ``/v1`` routes do, and answer 401 without it. vLLM's own ``/start_profile`` and
    ``/stop_profile`` keep vLLM's rule (its middleware guards ``/v1``-style paths only): the
    plugin never changes who may call vLLM's routes (docs/vllm.md)."""

    name = "stepscope"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import Request
        from fastapi.responses import JSONResponse, Response

        def route(path: str, what: str, ask: Callable[..., Any], with_since: bool) -> None:
            """``GET path``: the key checked, ``since`` read when the route takes one, then
            ``ask(state, since)``'s answer (a dict, or ready JSON text); what fails is said to
            the caller, never raised into the server."""

            async def answer(request):  # type: ignore[no-untyped-def]
                tokens = getattr(request.app.state, "stepscope_api_tokens", [])
                if not authorized(tokens, request.headers.get("Authorization")):
                    return JSONResponse({"error": "Unauthorized"}, status_code=401)
                since = 0
                if with_since:
                    try:
                        since = int(request.query_params.get("since", "0"))
                    except ValueError:
                        since = -1
                    if since < 0:
                        return JSONResponse(
                            {"error": "since must be a step index (an integer >= 0)"},
                            status_code=400,
                        )
                try:
                    got = await ask(request.app.state, since)
                except NoEngine as e:
                    return JSONResponse({"error": str(e)}, status_code=503)
                except Exception as e:  # noqa: BLE001 - reported to the caller, not raised
                    return JSONResponse({"error": f"{what} failed: {e}"}, status_code=500)
                if isinstance(got, str):
                    return Response(got, media_type="application/json")
                return JSONResponse(got)

            # A real class, not the string this module's annotations become: FastAPI reads it
            # to pass the request in.
            answer.__annotations__ = {"request": Request, "return": JSONResponse}
            answer.__name__ = what
            app.add_api_route(path, answer, methods=["GET"])

        route("/stepscope/status", "collective_rpc('stepscope_status')", _status, False)
        route("/stepscope/timeline", "collective_rpc('stepscope_timeline')", _timeline, True)
        route("/stepscope/requests", "the engine core's stepscope_requests", _requests, True)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        from stepscope.vllm.otel import attach

        state.stepscope_engine_client = engine_client
        state.stepscope_api_tokens = api_tokens(args)
        attach(engine_client)
