"""Stand-ins for the endpoint's tests: the served model's name and a batch that answers from a script."""

import time

from tba.serve.engine import Token

MODEL = "tiny-chat"


class Scripted:
    """A batch that answers every sample with `script`, one token per step (and can be told to fail)."""

    def __init__(self, script=(5, 6, 2), fail=False, delay=0.0):
        self.script, self.fail, self.delay, self.rows, self.cancelled = list(script), fail, delay, {}, []

    def add(self, rid, prompt, params):
        for i in range(params.n):
            self.rows[rid, i] = 0

    def cancel(self, rid):
        self.cancelled.append(rid)
        self.rows = {k: v for k, v in self.rows.items() if k[0] != rid}

    def step(self, version):
        if self.fail:
            raise RuntimeError("the model fell over")
        time.sleep(self.delay)
        out = []
        for (rid, i), at in list(self.rows.items()):
            last = at == len(self.script) - 1
            out.append(Token(rid, i, self.script[at], -0.5, version, None, "stop" if last else None))
            if last:
                del self.rows[rid, i]
            else:
                self.rows[rid, i] = at + 1
        return out

    @property
    def active(self):
        return len(self.rows)

    @property
    def idle(self):
        return not self.rows
