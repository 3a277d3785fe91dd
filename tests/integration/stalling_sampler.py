"""A sampler whose build blocks the way a searcher's start-up can (search.backend=<this file>:build): inside a
TCPStore connect — a C call, the one the broadcast transport makes to its trainer — to a port nobody listens on,
which torch retries for twice its timeout. It first leaves an empty file named after its process id in
$TBA_TEST_STALL_DIR, so that a test knows when every searcher is blocked. Fault injection lives here, not in the
product."""

import os
import socket
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore


def build(spec, *, source, tokenizer, device, seed, policy=None):
    with socket.socket() as s:  # a port that was free a moment ago: every connect is refused, and retried
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Path(os.environ["TBA_TEST_STALL_DIR"], str(os.getpid())).touch()
    TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=600))
    raise RuntimeError("unreachable: the connect above gives up after 20 minutes")
