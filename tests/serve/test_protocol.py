"""Request bodies: the settings tba does not honour and every bound are refused with the field named."""

import json

import pytest

from tba.serve.protocol import APIError, ChatIn, GenerateIn, Limits, params, parse

LIMITS = Limits(max_model_len=100, max_tokens=50, max_request_bytes=1000)


def _refused(body, model=GenerateIn, limits=LIMITS):
    with pytest.raises(APIError) as e:
        parse(json.dumps(body).encode() if not isinstance(body, bytes) else body, model, limits)
    return e.value


def test_bad_bodies_name_the_field():
    assert _refused({"model": "m", "token_ids": []}).param == "token_ids"
    assert _refused({"model": "m", "token_ids": [1], "sampling_params": {"top_k": 5}}).param == \
        "sampling_params.top_k"
    assert _refused({"model": "m", "messages": [{"role": "user"}], "frequency_penalty": 0.5}, ChatIn).param == \
        "frequency_penalty"
    assert _refused({"model": "m", "token_ids": [1], "sampling_params": {"temperature": -1}}).param == \
        "sampling_params.temperature"
    assert _refused(b"{").status == 400
    assert _refused({"model": "m", "token_ids": [1] * 400}).status == 413
    body = parse(b'{"model": "m", "token_ids": [1], "sampling_params": {"top_k": -1, "extra": 1}}', GenerateIn,
                 LIMITS)  # neutral values and unknown fields pass
    assert body.sampling_params.max_tokens is None


def test_limits_name_the_field():
    def p(**kw):
        args = {"prompt_len": 10, "n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": None,
                "stop_token_ids": None, "top_logprobs": 0, "limits": LIMITS, "vocab": 20,
                "prefix": "sampling_params.", "prompt_param": "token_ids"}
        return params(**{**args, **kw})

    assert p().max_tokens == 50 and p(prompt_len=80).max_tokens == 20
    for kw, field in (({"max_tokens": 51}, "sampling_params.max_tokens"), ({"prompt_len": 100}, "token_ids"),
                      ({"prompt_len": 90, "max_tokens": 20}, "sampling_params.max_tokens"),
                      ({"n": 17}, "sampling_params.n"), ({"stop_token_ids": [25]}, "sampling_params.stop_token_ids"),
                      ({"top_logprobs": 21}, "sampling_params.logprobs")):
        with pytest.raises(APIError) as e:
            p(**kw)
        assert e.value.param == field and e.value.status == 400 and field in e.value.message
