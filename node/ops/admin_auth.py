"""Admin HTTP access rule: one aiohttp middleware, so every endpoint added later is covered.

Rules:
1. Any method other than GET / HEAD / OPTIONS changes state and needs the admin token
   (`Authorization: Bearer <token>`), whatever the path. With no token configured such
   requests are refused (403): there is no way to change state anonymously.
2. GET / HEAD need the token too unless security.admin_read_open (default true).
3. Token comparison is constant-time; refusals say what is missing, never echo the header.
4. Request bodies are capped by aiohttp's client_max_size (1 MiB), set in AdminHttp.
"""
from __future__ import annotations

import hmac

from aiohttp import web

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def admin_auth_middleware(token: str, read_open: bool):
    expected = token.encode("utf-8")

    @web.middleware
    async def check(request: web.Request, handler):
        reading = request.method in READ_METHODS
        if reading and read_open:
            return await handler(request)
        if not expected:
            raise web.HTTPForbidden(text="admin credential not configured on this node "
                                         "(security.admin_token_file)\n")
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise web.HTTPUnauthorized(text="admin credential required: Authorization: "
                                            "Bearer <token>\n",
                                       headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(value.strip().encode("utf-8", "replace"), expected):
            raise web.HTTPForbidden(text="admin credential not accepted\n")
        return await handler(request)

    return check
