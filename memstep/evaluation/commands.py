"""How a worker process starts: its command and its environment. Light (no torch), so a Ray
worker imports it without the model's libraries (``ray_worker``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from memstep.errors import MemstepError
from memstep.evaluation.grid import Config

ROOT = Path(__file__).resolve().parent.parent.parent
REFERENCE = Config("memstep", "full")  # the full cache the KL and top-1 agreement are measured against
PEER_SCRIPT = ROOT / "peers" / "kvpress_peer.py"
KVPRESS_PYTHON = ROOT / ".venv-kvpress" / "bin" / "python"


def worker_command(config: Config, job_path: str, kvpress_python: str | Path | None = None) -> list[str]:
    if config.kind == "memstep":
        return [sys.executable, "-m", "memstep.evaluation.worker", job_path]
    if not PEER_SCRIPT.exists():
        raise MemstepError(f"the peer script {PEER_SCRIPT} is missing: run from a memstep checkout")
    if config.kind == "hf":
        return [sys.executable, str(PEER_SCRIPT), job_path]
    python = Path(kvpress_python or KVPRESS_PYTHON)
    if not python.exists():
        raise MemstepError(f"no kvpress virtualenv at {python}: run `make kvpress-venv`, "
                           "or pass --kvpress-python, or leave out --peers kvpress")
    return [str(python), str(PEER_SCRIPT), job_path]


def worker_env(threads: int) -> dict:
    """A worker's environment: this checkout's modules first, ``threads`` threads, quiet tokenizers."""
    return dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads),
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
