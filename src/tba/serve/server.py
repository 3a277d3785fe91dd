"""Running the endpoint: a sampler's batch, the engine thread, the app, and uvicorn on a socket bound here.

Why the socket is bound before uvicorn starts: port 0 then means "a free port" and the port is known at once, so
`tba serve --port 0` and the tests can print or read the URL; and the URL is announced only once uvicorn has
started, so whoever reads it can connect. `Server.run()` blocks (the CLI: uvicorn turns Ctrl-C or SIGTERM into a
graceful shutdown), `Server.start()` runs it in a background thread (tests, a searcher's endpoint); either way
`close()` stops uvicorn, then the engine thread, and closes nothing it was not given — the sampler is the caller's.
"""

from __future__ import annotations

import logging
import secrets
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from tba.errors import UserError
from tba.serve.app import Endpoint, create_app
from tba.serve.engine import Batch, EngineLoop
from tba.serve.protocol import Limits
from tba.serve.sessions import Sessions

logger = logging.getLogger(__name__)


def batch_for(sampler, slots: int) -> Callable[[], Batch]:
    """A factory of the serving batch over `sampler`: hf → tba.serve.hf_batch, vllm → tba.serve.vllm_batch."""
    from tba.rollout.samplers.hf import HFSampler
    from tba.rollout.samplers.vllm import VLLMSampler

    if isinstance(sampler, HFSampler):
        from tba.serve.hf_batch import HFBatch

        return lambda: HFBatch(sampler, slots)
    if isinstance(sampler, VLLMSampler):
        from tba.serve.vllm_batch import VLLMBatch

        return lambda: VLLMBatch(sampler)
    raise UserError(f"tba serve: {type(sampler).__name__} has no serving batch; the hf and vllm backends have")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _Uvicorn(uvicorn.Server):
    def __init__(self, config, on_ready: Callable[[], None] | None):
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


class Server:
    """The endpoint over `engine`, listening on host:port (127.0.0.1 unless told; port 0: a free one)."""

    def __init__(self, engine: EngineLoop, tokenizer, *, model_name: str, token: str | None = None,
                 limits: Limits, host: str = "127.0.0.1", port: int = 0, tools: str | None = "auto",
                 sessions: Sessions | None = None):
        self.engine = engine
        self.token = token or secrets.token_urlsafe(24)
        self.endpoint = Endpoint(engine, tokenizer, model_name=model_name, token=self.token, limits=limits,
                                 sessions=sessions, tools=tools)
        self.app = create_app(self.endpoint)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as e:
            self.socket.close()
            raise UserError(f"tba serve: cannot listen on {host}:{port}: {e.strerror}") from None
        self.host, self.port = host, self.socket.getsockname()[1]
        self._uvicorn: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def sessions(self) -> Sessions:
        return self.endpoint.sessions

    def _server(self, on_ready) -> _Uvicorn:
        config = uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5, access_log=False,
                                lifespan="off")

        def ready():
            self._ready.set()
            if on_ready is not None:
                on_ready()

        self._uvicorn = _Uvicorn(config, ready)
        return self._uvicorn

    def run(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve in this thread until Ctrl-C / SIGTERM (or `close()` from another thread), then stop the engine.
        uvicorn shuts down gracefully on either signal and then raises it again; both end here as a return."""
        if not self.engine.running:
            self.engine.start()
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
        try:
            self._server(on_ready).run(sockets=[self.socket])
        except KeyboardInterrupt:
            pass
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            self.close()

    def start(self, timeout: float = 30.0) -> Server:
        """Serve in a background thread; returns once it accepts connections."""
        if not self.engine.running:
            self.engine.start()
        server = self._server(None)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self.socket]}, name="tba-serve-http",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.close()
            raise RuntimeError(f"tba serve: the server did not start within {timeout:g} s")
        return self

    def close(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
            self._thread = None
        self.engine.stop()
        self.socket.close()

    def __enter__(self) -> Server:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc) -> None:
        self.close()
