"""The official openai and anthropic Python packages against `anelm serve`.

Run by crates/server/tests/clients.rs with ANELM_BASE (http://host:port), ANELM_MODEL and
ANELM_KEY set. Prints one line per check and '<N> passed, 0 failed' at the end; any failed
check raises, so the exit status is non-zero.
"""

import os
from typing import Literal, Optional

import anthropic
import openai
import pydantic

BASE = os.environ["ANELM_BASE"]
MODEL = os.environ["ANELM_MODEL"]
KEY = os.environ["ANELM_KEY"]
QUESTION = [{"role": "user", "content": "Name three animals that live in the sea."}]

passed = []


def check(name):
    def run(f):
        f()
        passed.append(name)
        print(f"ok: {name}", flush=True)
        return f

    return run


def raises(error, f):
    try:
        f()
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}")


oa = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)

# The reference answer, greedy.
plain = oa.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
ANSWER = plain.choices[0].message.content


@check("openai: models.list names the served model")
def _():
    ids = [m.id for m in oa.models.list()]
    assert ids == [MODEL], ids


@check("openai: chat, not streaming, with usage")
def _():
    c = plain.choices[0]
    assert isinstance(ANSWER, str) and ANSWER.strip(), plain
    assert c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = plain.usage
    assert u.prompt_tokens > 10, u
    assert 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert plain.model == MODEL and plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")


@check("openai: chat streaming gives the same text, and the usage last")
def _():
    stream = oa.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == ANSWER, (text, ANSWER)
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) > 1, "streamed in pieces"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert last.usage.completion_tokens == plain.usage.completion_tokens, last.usage
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens, last.usage


@check("openai: a stop sequence cuts the answer before it")
def _():
    words = ANSWER.split()
    assert len(words) >= 3, ANSWER
    stop = words[2]
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].message.content == ANSWER[: ANSWER.index(stop)], (r.choices[0].message.content, stop)
    assert r.choices[0].finish_reason == "stop"
    s = oa.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == ANSWER[: ANSWER.index(stop)]


@check("openai: completions")
def _():
    r = oa.completions.create(model=MODEL, prompt="The sea is", max_tokens=8, temperature=0)
    assert r.choices[0].text.strip() and r.usage.completion_tokens == 8, r
    assert r.choices[0].finish_reason == "length"


@check("openai: errors — unknown model, max_tokens 0, wrong key")
def _():
    try:
        oa.chat.completions.create(model="gpt-unknown", messages=QUESTION, max_tokens=4)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.code == "model_not_found", e
    try:
        oa.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=0)
        raise AssertionError("max_tokens=0 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == "max_tokens", e
    bad = openai.OpenAI(base_url=f"{BASE}/v1", api_key="not-the-key", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401, e


# Anthropic's reference answer, greedy. This client version has no sampling arguments; the
# server still reads Anthropic's `temperature` field.
GREEDY = {"temperature": 0}
message = an.messages.create(model=MODEL, max_tokens=24, messages=QUESTION, extra_body=GREEDY)
A_TEXT = message.content[0].text


@check("anthropic: messages, not streaming, with usage")
def _():
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert A_TEXT.strip(), message
    assert A_TEXT == ANSWER, "the same greedy answer through both APIs"
    assert message.stop_reason in ("end_turn", "max_tokens"), message.stop_reason
    assert message.usage.input_tokens == plain.usage.prompt_tokens, message.usage
    assert message.usage.output_tokens == plain.usage.completion_tokens, message.usage


@check("anthropic: streaming events in order, same text and usage")
def _():
    kinds = []
    with an.messages.stream(model=MODEL, max_tokens=24, messages=QUESTION, extra_body=GREEDY) as s:
        for event in s:
            kinds.append(event.type)
        final = s.get_final_message()
    assert final.content[0].text == A_TEXT, final
    assert final.usage.output_tokens == message.usage.output_tokens, final.usage
    raw = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_delta",
                                     "content_block_stop", "message_delta", "message_stop")]
    assert raw[:2] == ["message_start", "content_block_start"], raw
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"], raw
    assert set(raw[2:-3]) == {"content_block_delta"} and len(raw) > 6, raw


@check("anthropic: system prompt and stop_sequences")
def _():
    words = A_TEXT.split()
    stop = words[2]
    r = an.messages.create(model=MODEL, max_tokens=24, messages=QUESTION, stop_sequences=[stop], extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r
    assert r.content[0].text == A_TEXT[: A_TEXT.index(stop)], r
    with_system = an.messages.create(
        model=MODEL, max_tokens=8, messages=QUESTION, system="You answer in French.", extra_body=GREEDY)
    assert with_system.usage.input_tokens != message.usage.input_tokens, "the system prompt is in the prompt"


@check("anthropic: count_tokens agrees with usage")
def _():
    n = an.messages.count_tokens(model=MODEL, messages=QUESTION)
    assert n.input_tokens == message.usage.input_tokens, n


@check("anthropic: errors — unknown model, max_tokens 0, wrong key")
def _():
    try:
        an.messages.create(model="claude-unknown", max_tokens=4, messages=QUESTION)
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        assert e.status_code == 404 and e.body["error"]["type"] == "not_found_error", e.body
    try:
        an.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)
        raise AssertionError("max_tokens=0 was accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", e.body
    bad = anthropic.Anthropic(base_url=BASE, api_key="not-the-key", max_retries=0)
    try:
        bad.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.status_code == 401, e


class Reading(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    celsius: float
    sky: Literal["clear", "cloudy", "rain", "snow"]


class Forecast(pydantic.BaseModel):
    readings: list[Reading] = pydantic.Field(max_length=3)
    note: Optional[str] = pydantic.Field(default=None, max_length=40)


ASK_WEATHER = [{"role": "user", "content": "Give the weather in two cities as JSON."}]


@check("openai: chat.completions.parse fills a Pydantic model (json_schema, strict)")
def _():
    for extra in [dict(temperature=0), dict(temperature=1.0, seed=4, n=3)]:
        r = oa.chat.completions.parse(model=MODEL, messages=ASK_WEATHER, response_format=Forecast,
                                      max_tokens=200, **extra)
        for choice in r.choices:
            assert choice.finish_reason == "stop", choice
            assert isinstance(choice.message.parsed, Forecast), choice.message


@check("openai: responses.parse fills a Pydantic model (text_format)")
def _():
    r = oa.responses.parse(model=MODEL, input=ASK_WEATHER[0]["content"], text_format=Forecast,
                           max_output_tokens=200, temperature=0)
    assert isinstance(r.output_parsed, Forecast), r.output


@check("openai: embeddings — unit vectors, a batch as its singles, float and base64 alike, token ids")
def _():
    texts = ["The cat sat on the mat.", "Quantum chromodynamics.", "The cat sat on the mat."]
    e = oa.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    vs = [d.embedding for d in e.data]
    assert [d.index for d in e.data] == [0, 1, 2], e.data
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vs), [sum(x * x for x in v) for v in vs]
    assert vs[0] == vs[2] and vs[0] != vs[1]
    assert e.usage.prompt_tokens == e.usage.total_tokens > 6, e.usage
    one = oa.embeddings.create(model=MODEL, input=texts[1], encoding_format="float").data[0].embedding
    assert len(one) == len(vs[1]) and max(abs(a - b) for a, b in zip(one, vs[1])) < 1e-6
    ids = oa.embeddings.create(model=MODEL, input=[[1, 2, 3, 4], [5, 6]]).data
    assert len(ids) == 2 and len(ids[0].embedding) == len(one)
    e = raises(openai.BadRequestError, lambda: oa.embeddings.create(model=MODEL, input="x", dimensions=8))
    assert e.param == "dimensions", e


print(f"{len(passed)} passed, 0 failed")
