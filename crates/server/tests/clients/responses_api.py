"""The official openai (Responses API, chat reasoning) and anthropic (thinking blocks) packages
against `anelm serve`.

Run by crates/server/tests/responses.rs with ANELM_BASE / ANELM_MODEL (SmolLM2, for text) and
ANELM_SCRIPTED_BASE (the scripted model "m" of tests/common/scripted.rs, which thinks on "hi"
and calls get_weather on "weather"). Prints one line per check and '<N> passed, 0 failed' at
the end; a failed check raises, so the exit status is non-zero.
"""

import json
import os

import anthropic
import openai

BASE = os.environ["ANELM_BASE"]
MODEL = os.environ["ANELM_MODEL"]
SCRIPTED = os.environ["ANELM_SCRIPTED_BASE"]
QUESTION = "Name three animals that live in the sea."

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


oa = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0, timeout=120)
sc = openai.OpenAI(base_url=f"{SCRIPTED}/v1", api_key="none", max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=SCRIPTED, api_key="none", max_retries=0, timeout=120)

# Long enough for the whole answer: the SDK's stream manager wants `response.completed` (a reply
# cut by max_output_tokens ends with `response.incomplete`, as OpenAI's does).
GREEDY = {"temperature": 0, "max_output_tokens": 96}
first = oa.responses.create(model=MODEL, input=QUESTION, **GREEDY)
chat = oa.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=96, temperature=0)


@check("responses.create: the same greedy text and usage as chat completions")
def _():
    assert first.object == "response" and first.id.startswith("resp_"), first
    assert first.output_text == chat.choices[0].message.content, (first.output_text, chat)
    assert first.output[0].type == "message" and first.output[0].role == "assistant"
    assert first.usage.input_tokens == chat.usage.prompt_tokens, first.usage
    assert first.usage.output_tokens == chat.usage.completion_tokens, first.usage
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    if chat.choices[0].finish_reason == "length":
        assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    else:
        assert first.status == "completed", first.status


@check("responses.create(stream=True): the event sequence and the same text")
def _():
    events = list(oa.responses.create(model=MODEL, input=QUESTION, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{first.status}"], kinds
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == first.output_text, deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == first.usage.output_tokens


@check("responses.stream: the SDK assembles the final response")
def _():
    assert first.status == "completed", first
    with oa.responses.stream(model=MODEL, input=QUESTION, **GREEDY) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == first.output_text, final


@check("previous_response_id continues the conversation, as chat with the history does")
def _():
    follow = "Name two more."
    r = oa.responses.create(model=MODEL, input=follow, previous_response_id=first.id, **GREEDY)
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": follow}]
    c = oa.chat.completions.create(model=MODEL, messages=history, max_tokens=96, temperature=0)
    assert r.usage.input_tokens == c.usage.prompt_tokens, (r.usage, c.usage)
    assert r.output_text == c.choices[0].message.content, (r.output_text, c)
    assert r.previous_response_id == first.id


@check("instructions go first, and are not carried over")
def _():
    r = oa.responses.create(model=MODEL, input=QUESTION, instructions="You answer in French.", **GREEDY)
    c = oa.chat.completions.create(model=MODEL, max_tokens=96, temperature=0, messages=[
        {"role": "system", "content": "You answer in French."}, {"role": "user", "content": QUESTION}])
    assert r.usage.input_tokens == c.usage.prompt_tokens, (r.usage, c.usage)
    assert r.instructions == "You answer in French."


@check("a reply cut by max_output_tokens is incomplete, and its stream ends with response.incomplete")
def _():
    r = oa.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 3, r.usage
    events = list(oa.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete", [e.type for e in events]
    assert events[-1].response.output[0].content[0].text == r.output_text


@check("responses.retrieve and responses.delete; store=False keeps nothing")
def _():
    r = oa.responses.create(model=MODEL, input="Say hi.", temperature=0, max_output_tokens=4)
    got = oa.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text, got
    oa.responses.delete(r.id)
    raises(openai.NotFoundError, lambda: oa.responses.retrieve(r.id))
    raises(openai.NotFoundError, lambda: oa.responses.delete(r.id))
    e = raises(openai.BadRequestError, lambda: oa.responses.create(
        model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=2))
    assert e.param == "previous_response_id" and e.code == "previous_response_not_found", e
    unstored = oa.responses.create(model=MODEL, input="Say hi.", store=False, max_output_tokens=2)
    raises(openai.NotFoundError, lambda: oa.responses.retrieve(unstored.id))


@check("bad input: 400s naming the field, and the server keeps serving")
def _():
    for kwargs, param in [
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "no_such_item"}]}, "input[0].type"),
        ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ]:
        e = raises(openai.BadRequestError, lambda: oa.responses.create(model=MODEL, **kwargs))
        assert e.status_code == 400 and e.param == param, (param, e.param, e.message)
        assert e.body["type"] == "invalid_request_error", e.body
    assert oa.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2).output_text


WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@check("a function tool round trip: function_call out, function_call_output in")
def _():
    r = sc.responses.create(model="m", input="weather", tools=WEATHER)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather", r.output
    assert json.loads(call.arguments) == {"city": "Paris"}, call.arguments
    assert call.call_id.startswith("call_") and len(r.output) == 1, r.output
    answer = sc.responses.create(model="m", previous_response_id=r.id, tools=WEATHER, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert answer.output_text == "answer", answer
    # The same with the whole conversation given as items.
    items = [{"role": "user", "content": "weather"},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}]
    assert sc.responses.create(model="m", tools=WEATHER, input=items).output_text == "answer"


@check("a streamed function call: arguments events, assembled by the SDK")
def _():
    kinds = []
    with sc.responses.stream(model="m", input="weather", tools=WEATHER) as s:
        for e in s:
            kinds.append(e.type)
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in kinds, kinds
    assert "response.function_call_arguments.done" in kinds, kinds
    call = final.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}, final.output


@check("tool_choice: none leaves the tools out; required and a named function force the call")
def _():
    r = sc.responses.create(model="m", input="weather", tools=WEATHER, tool_choice="none")
    assert r.usage.input_tokens == sc.responses.create(model="m", input="weather").usage.input_tokens
    for choice in ["required", {"type": "function", "name": "get_weather"}]:
        # "hi" would make the model think: the forced call holds it to a call all the same.
        r = sc.responses.create(model="m", input="weather", tools=WEATHER, tool_choice=choice)
        assert [o.type for o in r.output] == ["function_call"], (choice, r.output)
        assert json.loads(r.output[0].arguments) == {"city": "Paris"}, r.output
    e = raises(openai.BadRequestError, lambda: sc.responses.create(
        model="m", input="weather", tools=WEATHER, tool_choice={"type": "function", "name": "launch"}))
    assert e.param == "tool_choice", e


@check("reasoning: a reasoning item before the message, streamed as reasoning_text events")
def _():
    r = sc.responses.create(model="m", input="hi")
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    assert r.output[0].content[0].text == "hmmyes" and r.output_text == "answer", r.output
    assert r.usage.output_tokens_details.reasoning_tokens == 3, r.usage
    with sc.responses.stream(model="m", input="hi") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in kinds, kinds
    assert final.output[0].content[0].text == "hmmyes" and final.output_text == "answer"


@check("chat completions: reasoning_content apart from content, stream and not")
def _():
    c = sc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    m = c.choices[0].message
    assert m.content == "answer" and m.model_extra["reasoning_content"] == "hmmyes", m
    chunks = list(sc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    thought = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert (thought, text) == ("hmmyes", "answer"), (thought, text)


@check("anthropic: thinking blocks, stream and not, and a budget")
def _():
    ask = dict(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    m = an.messages.create(**ask)
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    assert m.content[0].thinking == "hmmyes" and m.content[1].text == "answer", m.content
    with an.messages.stream(**ask) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "thinking" in kinds, kinds
    assert final.content[0].thinking == "hmmyes" and final.content[1].text == "answer", final.content
    short = an.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1})
    assert short.content[0].thinking == "hmm" and short.content[1].text == "answer", short.content
    # The reply sent back with its thinking block, as clients keep a conversation.
    again = an.messages.create(model="m", max_tokens=20, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": "hi"}])
    assert again.content[1].text == "answer", again.content


AN_WEATHER = [{"name": "get_weather", "description": "The weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@check("anthropic: tools — tool_use out, tool_result in, stream and not")
def _():
    ask = [{"role": "user", "content": "weather"}]
    m = an.messages.create(model="m", max_tokens=20, tools=AN_WEATHER, messages=ask)
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}, m.content
    assert uses[0].id.startswith("toolu_"), uses[0]
    answer = an.messages.create(model="m", max_tokens=20, tools=AN_WEATHER, messages=ask + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny"}]}])
    assert answer.stop_reason == "end_turn" and answer.content[-1].text == "answer", answer.content
    with an.messages.stream(model="m", max_tokens=20, tools=AN_WEATHER, messages=ask) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in kinds, kinds
    assert final.stop_reason == "tool_use", final
    use = [b for b in final.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}, final.content


@check("anthropic: tool_choice any / tool force the call; none leaves the tools out")
def _():
    hi = [{"role": "user", "content": "hi"}]
    for choice in [{"type": "any"}, {"type": "tool", "name": "get_weather"}]:
        # "hi" makes the model think; the forced call holds it to a call all the same.
        m = an.messages.create(model="m", max_tokens=20, tools=AN_WEATHER, tool_choice=choice, messages=hi)
        assert m.stop_reason == "tool_use", (choice, m)
        assert [b.type for b in m.content] == ["tool_use"], m.content
        assert m.content[0].input == {"city": "Paris"}, m.content
    m = an.messages.create(model="m", max_tokens=20, tools=AN_WEATHER, tool_choice={"type": "none"},
                           messages=[{"role": "user", "content": "hello"}])
    assert m.stop_reason == "end_turn" and m.content[-1].text == "answer", m.content
    plain = an.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}])
    none = an.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}],
                                    tools=AN_WEATHER, tool_choice={"type": "none"})
    with_tools = an.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}], tools=AN_WEATHER)
    assert none.input_tokens == plain.input_tokens < with_tools.input_tokens, (plain, none, with_tools)


@check("anthropic: bad tool input — an unknown tool_use_id, a schema that is not an object, an unknown forced tool")
def _():
    bad = [
        dict(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}],
             tools=AN_WEATHER),
        dict(messages=[{"role": "user", "content": "weather"}],
             tools=[{"name": "f", "input_schema": "not a schema"}]),
        dict(messages=[{"role": "user", "content": "weather"}], tools=AN_WEATHER,
             tool_choice={"type": "tool", "name": "launch"}),
    ]
    for kwargs in bad:
        e = raises(anthropic.BadRequestError, lambda: an.messages.create(model="m", max_tokens=20, **kwargs))
        assert e.status_code == 400 and e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
    assert an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hello"}]).content


CHAT_WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@check("openai chat: tool calls round trip, streamed deltas assembled by the SDK, forced by name")
def _():
    ask = [{"role": "user", "content": "weather"}]
    r = sc.chat.completions.create(model="m", messages=ask, tools=CHAT_WEATHER)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}, call
    answer = sc.chat.completions.create(model="m", tools=CHAT_WEATHER, messages=ask + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}])
    assert answer.choices[0].message.content == "answer", answer
    with sc.chat.completions.stream(model="m", messages=ask, tools=CHAT_WEATHER) as s:
        for _event in s:
            pass
        final = s.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls", final
    assert streamed.function.name == "get_weather" and json.loads(streamed.function.arguments) == {"city": "Paris"}
    forced = sc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=CHAT_WEATHER,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather", forced


print(f"{len(passed)} passed, 0 failed")
