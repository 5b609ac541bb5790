"""`operatorx serve`: the dashboard as a Starlette app over a read-only store. GET only; every page is
the query layer's data rendered by web/render.py. Every parameter is bounded before it reaches the
store (400 with the reason in one line), and a run or case the store lacks is a 404."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from operatorx.web import render
from operatorx.web.gpus import MAX_FLEET_RUNS
from operatorx.web.model import MAX_MODEL_RUNS, ModelRequestError, scenario_asks
from operatorx.web.queries import Queries, WebError

__all__ = ["create_app", "STATIC_DIR", "MAX_RUN_REF_CHARS", "MAX_SHAPE_RUNS", "MAX_CASE_INDEX_DIGITS"]

MAX_RUN_REF_CHARS = 256
"""The longest run reference a URL may hold: twice the longest id a page shows (`shown_name`), so no
real id is refused, and a 50,000-character one is a 400 before it reaches the database."""
MAX_SHAPE_RUNS = 32
"""Runs one Shape page draws at most: each is a document read; more is a 400, not a slow page."""
MAX_CASE_INDEX_DIGITS = 9
"""A case index fits a 32-bit column; a longer number is a 400 (Python would parse any length)."""


class BadRequest(Exception):
    """A parameter no page can answer, in one line (the response is a 400)."""


def run_ref(value: str, what: str = "run") -> str:
    """`value` when it can name a run: not empty, at most MAX_RUN_REF_CHARS, every character printable
    (pages write other characters as `\\x..` escapes, so a URL never needs them)."""
    if not value:
        raise BadRequest(f"{what}: empty; give a run id, a unique prefix of one, or latest")
    if len(value) > MAX_RUN_REF_CHARS:
        raise BadRequest(f"{what}: {len(value):,} characters, longer than any run id ({MAX_RUN_REF_CHARS} at most)")
    if not value.isprintable():
        raise BadRequest(f"{what}: holds control or invisible characters; pages write them as \\x.. escapes")
    return value


def case_index(value: str) -> int:
    """A case index from a URL: 1 to MAX_CASE_INDEX_DIGITS decimal digits."""
    if not value.isascii() or not value.isdigit() or len(value) > MAX_CASE_INDEX_DIGITS:
        raise BadRequest(f"case index {value[:20]!r}: give a whole number of at most {MAX_CASE_INDEX_DIGITS} digits")
    return int(value)


STATIC_DIR = Path(__file__).parent / "static"
_HEADERS = {
    # Pages run only their own scripts; inline JSON is data (type application/json), never executed.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(queries: Queries) -> Starlette:
    links = render.server_links()

    def page(html: str, status: int = 200) -> Response:
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    def not_found(err: Exception) -> Response:
        return page(render.render_error(str(err), links), 404)

    def answer(build: Callable[[Request], str]) -> Callable[[Request], Response]:
        """A page, or 400 for a parameter out of bounds, or 404 for a run or case the store lacks."""
        def endpoint(request: Request) -> Response:
            try:
                return page(build(request))
            except BadRequest as err:
                return page(render.render_error(str(err), links, title="Bad request"), 400)
            except WebError as err:
                return not_found(err)
        return endpoint

    def runs(request: Request) -> str:
        return render.render_runs(queries.runs(), links)

    def run(request: Request) -> str:
        return render.render_run(queries.run_page(run_ref(request.path_params["run"])), links)

    def shape(request: Request) -> str:
        wanted = [r.strip() for r in request.query_params.get("runs", "").split(",") if r.strip()]
        if len(wanted) > MAX_SHAPE_RUNS:
            raise BadRequest(f"runs: {len(wanted):,} runs, more than one Shape page draws ({MAX_SHAPE_RUNS} at most)")
        runs = queries.shape_rows([run_ref(r, "runs") for r in wanted] or queries.default_shape_runs())
        return render.render_shape([(r, render.shape_rows(rows)) for r, rows in runs], links)

    def group(request: Request) -> str:
        return render.render_group(queries.group_page(run_ref(request.path_params["name"], "group")), links)

    def roofline(request: Request) -> str:
        return render.render_roofline(queries.roofline(run_ref(request.path_params["run"])), links)

    def case(request: Request) -> str:
        run_id, index = run_ref(request.path_params["run"]), case_index(request.path_params["index"])
        summary, detail = queries.case(run_id, index)
        return render.render_case(summary, links, detail=detail)

    def compare(request: Request) -> str:
        a: Optional[str] = request.query_params.get("a")
        b: Optional[str] = request.query_params.get("b")
        if not a and not b:
            return render.render_compare(None, links, queries.runs())          # the picker
        if not a or not b:
            raise BadRequest(f"compare: give both a and b (got only {'a' if a else 'b'})")
        cmp = queries.compare(run_ref(a, "a"), run_ref(b, "b"))
        return render.render_compare(cmp, links, queries.runs())

    def gpus_index(request: Request) -> str:
        return render.render_gpus_index(queries.gpu_testlists(), links)

    def gpus(request: Request) -> str:
        testlist = request.path_params["testlist"]
        if len(testlist) > MAX_RUN_REF_CHARS or not testlist.isprintable():
            raise BadRequest("testlist: longer than any testlist name, or holds control characters")
        wanted = [r.strip() for r in request.query_params.get("runs", "").split(",") if r.strip()]
        if len(wanted) > MAX_FLEET_RUNS:
            raise BadRequest(f"runs: {len(wanted):,} runs, more than one GPUs page holds ({MAX_FLEET_RUNS} at most)")
        return render.render_gpus(queries.gpus_page(testlist, [run_ref(r, "runs") for r in wanted] or None), links)

    def model(request: Request) -> str:
        wanted = [r.strip() for r in request.query_params.getlist("run") if r.strip()]
        if not wanted:
            return render.render_model(None, links, queries.runs())              # the picker
        if len(wanted) > MAX_MODEL_RUNS:
            raise BadRequest(f"run: {len(wanted):,} runs, more than one Model page draws ({MAX_MODEL_RUNS} at most)")
        runs = [run_ref(r) for r in wanted]
        try:
            asks = scenario_asks(request.query_params.getlist, len(runs))
            page = queries.model_page(runs, asks)
        except ModelRequestError as err:
            raise BadRequest(str(err)) from None
        return render.render_model(page, links, queries.runs())

    routes = [
        Route("/", answer(runs)), Route("/run/{run:path}", answer(run)), Route("/shape", answer(shape)),
        Route("/roofline/{run:path}", answer(roofline)), Route("/case/{run:path}/{index}", answer(case)),
        Route("/compare", answer(compare)), Route("/group/{name:path}", answer(group)),
        Route("/gpus", answer(gpus_index)), Route("/gpus/{testlist:path}", answer(gpus)),
        Route("/model", answer(model)),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes)
