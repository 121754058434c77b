"""Who a request comes from, as far as the client cannot choose it.

A Gradio session hash is made by the client: a script can send a new one with every request, so
nothing that bounds one visitor (the compressed models' disk quota, the reads of uploads, the
bytes of uploads) may be keyed by it. The client's address as Gradio sees it (the connection's
peer, or what the server's trusted proxy reports) is what these bounds are keyed by here, as a
keyed hash: it never appears in a folder name or a log.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

_SECRET = secrets.token_bytes(32)  # keys the hashes: an address cannot be read back from its key


def current_request():
    """The Gradio request this thread serves (None outside an event)."""
    try:
        from gradio.context import LocalContext

        return LocalContext.request.get(None)
    except Exception:  # noqa: BLE001 - Gradio's internals moved: no request known
        return None


def client_address(request) -> str:
    """The client's address as Gradio sees it ("" when the request has none)."""
    client = getattr(request, "client", None) if request is not None else None
    host = getattr(client, "host", None) if client is not None else None
    if host is None and isinstance(client, dict):
        host = client.get("host")
    return host if isinstance(host, str) else ""


def visitor_key(request=None) -> str:
    """A visitor's key: a keyed hash of its address ("" for no address: a call from inside the server,
    such as a test or an example built at start). Without ``request``, the request this thread serves."""
    address = client_address(request if request is not None else current_request())
    if not address:
        return ""
    return hmac.new(_SECRET, b"address:" + address.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:24]
