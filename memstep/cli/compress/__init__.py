"""`memstep compress {laco,drop,sparse}`: shrink the model itself, one module per method."""

from __future__ import annotations

from memstep.cli.compress import drop, laco, sparse


def register(sub) -> None:
    p = sub.add_parser("compress", help="shrink the model: layer collapse (laco), layer dropping (drop) or pruning (sparse)")
    methods = p.add_subparsers(dest="method", required=True, parser_class=type(p))
    laco.register(methods)
    drop.register(methods)
    sparse.register(methods)
