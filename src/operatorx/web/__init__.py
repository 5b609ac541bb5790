"""The dashboard: a read-only web app (`operatorx serve`) and a static site (`operatorx report build`)
over the results database, from one query layer (queries.py) and one set of templates."""

from operatorx.web.queries import Queries, WebError, open_store

__all__ = ["Queries", "WebError", "open_store"]
