"""What the multi-process training tests share: a gloo check, a free loopback port, the example scripts as modules."""

import importlib.util
import socket
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "accelerate"

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()), reason="needs the gloo backend"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for torchrun's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_script(path: Path, name: str):
    """An example script imported as a module (its helpers are the one-process reference of a test)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
