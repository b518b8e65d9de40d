"""The inspector page (``GET /admin/ui``): static files under ``proxy/ui``, no build step.

Served only when the admin API is on. The page itself holds no secret: it asks for the admin
token, keeps it in the browser tab's session storage, and sends it as a header on each admin
API call. Conversation text is attacker-controlled, so the page is served with a strict
Content-Security-Policy (scripts and styles from this origin only, no inline code, nothing
framed, no forms posted) and builds every piece of text as a text node, never as markup.
"""

from __future__ import annotations

from importlib.resources import files

from aiohttp import web

from compaction_proxy.http.app_keys import SERVICES

_UI = files("compaction_proxy.http") / "ui"
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _asset(name: str) -> tuple[bytes, str] | None:
    """A file of the page by its plain name (no paths: nothing outside ``proxy/ui``)."""
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in _TYPES:
        return None
    resource = _UI / name
    if not resource.is_file():
        return None
    return resource.read_bytes(), _TYPES[suffix]


async def page(request: web.Request) -> web.StreamResponse:
    if request.app[SERVICES].settings.admin_token is None:
        raise web.HTTPNotFound()
    name = request.match_info.get("name") or "index.html"
    found = _asset(name)
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(body=body, content_type=content_type, headers=SECURITY_HEADERS)


def inspector_routes() -> list[web.RouteDef]:
    return [
        web.get("/admin/ui", page),
        web.get("/admin/ui/", page),
        web.get("/admin/ui/{name}", page),
    ]
