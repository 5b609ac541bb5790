"""`operatorx serve`: the dashboard as a Starlette app over a read-only store. GET only; every page is
the query layer's data rendered by web/render.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from operatorx.web import render
from operatorx.web.queries import Queries, WebError

__all__ = ["create_app", "STATIC_DIR"]

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

    def runs(request: Request) -> Response:
        return page(render.render_runs(queries.runs(), links))

    def run(request: Request) -> Response:
        try:
            return page(render.render_run(queries.run_page(request.path_params["run"]), links))
        except WebError as err:
            return not_found(err)

    def shape(request: Request) -> Response:
        wanted = [r for r in request.query_params.get("runs", "").split(",") if r.strip()]
        try:
            runs = queries.shape_rows(wanted or queries.default_shape_runs())
            return page(render.render_shape([(r, render.shape_rows(rows)) for r, rows in runs], links))
        except WebError as err:
            return not_found(err)

    def roofline(request: Request) -> Response:
        try:
            return page(render.render_roofline(queries.roofline(request.path_params["run"]), links))
        except WebError as err:
            return not_found(err)

    def case(request: Request) -> Response:
        try:
            summary, detail = queries.case(request.path_params["run"], request.path_params["index"])
            return page(render.render_case(summary, links, detail=detail))
        except WebError as err:
            return not_found(err)

    def compare(request: Request) -> Response:
        a: Optional[str] = request.query_params.get("a")
        b: Optional[str] = request.query_params.get("b")
        try:
            cmp = queries.compare(a, b) if a and b else None
            return page(render.render_compare(cmp, links, queries.runs()))
        except WebError as err:
            return not_found(err)

    routes = [
        Route("/", runs), Route("/run/{run:path}", run), Route("/shape", shape),
        Route("/roofline/{run:path}", roofline), Route("/case/{run:path}/{index:int}", case),
        Route("/compare", compare), Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes)
