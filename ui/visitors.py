"""Who a request comes from, as far as the client cannot choose it.

A Gradio session hash is made by the client: a script can send a new one with every request, so
nothing that bounds one visitor (the compressed models' disk quota, the reads of uploads, the
bytes of uploads) may be keyed by it. The client's address is what these bounds are keyed by
here, as a keyed hash: it never appears in a folder name or a log. Locally that is the
connection's peer, as Gradio sees it. Behind a reverse proxy every connection comes from the
proxy (on a Hugging Face Space, an internal address), so there the address is the entry the
proxy appended to X-Forwarded-For: ``MEMSTEP_TRUSTED_PROXY_HOPS`` (default 1 on a Space, 0
elsewhere) counts the proxies whose entries, from the right, are trusted; the entries to their
left are the client's own words and are never read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

_SECRET = secrets.token_bytes(32)  # keys the hashes: an address cannot be read back from its key


def current_request():
    """The Gradio request this thread serves (None outside an event)."""
    try:
        from gradio.context import LocalContext

        return LocalContext.request.get(None)
    except Exception:  # noqa: BLE001 - Gradio's internals moved: no request known
        return None


def trusted_proxy_hops() -> int:
    """How many reverse proxies in front of the app append to X-Forwarded-For (see the module's notes)."""
    default = "1" if os.environ.get("SPACE_ID") else "0"
    try:
        return max(0, int(os.environ.get("MEMSTEP_TRUSTED_PROXY_HOPS", default)))
    except ValueError:
        return int(default)


def client_address(request) -> str:
    """The client's address: the connection's peer as Gradio sees it, or behind trusted proxies the
    entry the outermost of them appended to X-Forwarded-For ("" when the request has none)."""
    client = getattr(request, "client", None) if request is not None else None
    host = getattr(client, "host", None) if client is not None else None
    if host is None and isinstance(client, dict):
        host = client.get("host")
    hops = trusted_proxy_hops()
    if hops and request is not None:
        headers = getattr(request, "headers", None) or {}
        values = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [
            headers.get("x-forwarded-for", "")]
        entries = [entry.strip() for value in values for entry in str(value or "").split(",") if entry.strip()]
        if len(entries) >= hops:
            return entries[-hops]
    return host if isinstance(host, str) else ""


def visitor_key(request=None) -> str:
    """A visitor's key: a keyed hash of its address ("" for no address: a call from inside the server,
    such as a test or an example built at start). Without ``request``, the request this thread serves."""
    address = client_address(request if request is not None else current_request())
    if not address:
        return ""
    return hmac.new(_SECRET, b"address:" + address.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:24]
