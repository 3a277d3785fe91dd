"""The engine thread: concurrent requests decode in one batch, a closed stream cancels its request, a failed step
fails only the requests in flight."""

import asyncio
import contextlib
import time

import pytest
from scripted import Scripted

from tba.serve.engine import EngineLoop, Params
from tba.serve.server import batch_for


async def _collect(engine, prompt, params):
    got = []
    async for step in engine.stream(prompt, params):
        got += step
    return got


def test_concurrent_requests_decode_together(sampler, chat_tokenizer):
    engine = EngineLoop(batch_for(sampler, 8), version=lambda: 2).start()
    try:
        prompts = [chat_tokenizer.encode(f"{a}+{a}=") for a in range(6)]

        async def main():
            return await asyncio.gather(*(_collect(engine, p, Params(temperature=1.0, max_tokens=20))
                                          for p in prompts))

        results = asyncio.run(main())
    finally:
        engine.stop()
    assert all(r and r[-1].finish for r in results) and {t.version for r in results for t in r} == {2}
    assert engine.stats.max_active == 6  # six requests in flight were six rows of one forward
    assert engine.stats.steps <= max(len(r) for r in results) + 1 < sum(len(r) for r in results)


def test_closing_a_stream_cancels_its_request():
    batch = Scripted(script=list(range(3, 500)), delay=0.01)
    engine = EngineLoop(lambda: batch).start()

    async def main():
        async with contextlib.aclosing(engine.stream([1], Params())) as stream:
            async for _ in stream:
                break  # a client gone after its first token

    try:
        asyncio.run(main())
        for _ in range(100):
            if batch.cancelled:
                break
            time.sleep(0.01)
    finally:
        engine.stop()
    assert len(batch.cancelled) == 1 and batch.idle


def test_a_failed_step_fails_its_requests_and_the_loop_goes_on():
    batches = [Scripted(fail=True), Scripted()]
    engine = EngineLoop(lambda: batches.pop(0)).start()
    try:
        with pytest.raises(RuntimeError, match="fell over"):
            asyncio.run(_collect(engine, [1], Params()))
        assert [t.token for t in asyncio.run(_collect(engine, [1], Params(n=2)))] == [5, 5, 6, 6, 2, 2]
    finally:
        engine.stop()
    assert engine.stats.errors == 1 and not engine.running
