"""What every raypost HTTP surface checks before it reads a request: the bearer token (when the
app has one) and the declared body size."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request


def check_bearer(authorization: str | None, token: str | None) -> None:
    """401 unless ``authorization`` is ``Bearer <token>``; nothing to check when ``token`` is None."""
    if token is None:
        return
    if not hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode()):
        raise HTTPException(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 from its Content-Length before it is read, or as soon as a body
    without one passes ``limit``; 400 for a Content-Length that is not a number."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HTTPException(400, f"Content-Length {declared[:40]!r} is not a number")
        if int(declared) > limit:
            raise HTTPException(413, f"body of {int(declared)} bytes is over the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"body is over the limit of {limit} bytes")
    return bytes(body)
