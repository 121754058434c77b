"""`memstep compress {laco,sparse}`: shrink the model itself. Each method registers its own
subcommand from its module (memstep/compress/laco_cli.py, memstep/compress/sparse_cli.py)."""

from __future__ import annotations

import importlib

METHODS = ("memstep.compress.laco_cli", "memstep.compress.sparse_cli")


def register(sub) -> None:
    p = sub.add_parser("compress", help="shrink the model: layer collapse (laco) or pruning (sparse)")
    methods = p.add_subparsers(dest="method", required=True, parser_class=type(p))
    for module in METHODS:
        try:
            importlib.import_module(module).register(methods)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
