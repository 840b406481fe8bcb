"""A published agent framework — the OpenAI Agents SDK — driving a two-tool task end to end
against `anelm serve`, through the Responses API and through Chat Completions, plain and streamed.

Run by crates/server/tests/agents.rs with ANELM_SCRIPTED_BASE: the scripted model "m" of
tests/common/scripted.rs calls get_weather on "weather", to_fahrenheit when a tool answers
"celsius", and answers "answer" after any other tool result. Prints one line per check and
'<N> passed, 0 failed' at the end; a failed check raises.
"""

import asyncio
import os

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                    Runner, function_tool, set_tracing_disabled)
from openai import AsyncOpenAI

SCRIPTED = os.environ["ANELM_SCRIPTED_BASE"]
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=f"{SCRIPTED}/v1", api_key="none", max_retries=0, timeout=60)
calls = []


@function_tool
def get_weather(city: str) -> str:
    """The current temperature in a city, in degrees Celsius."""
    calls.append(("get_weather", {"city": city}))
    return "celsius"


@function_tool
def to_fahrenheit(celsius: float) -> str:
    """Converts a temperature from Celsius to Fahrenheit."""
    calls.append(("to_fahrenheit", {"celsius": celsius}))
    return f"{celsius * 9 / 5 + 32:.1f} F"


checks = []


def check(name):
    """Registers a check; they all run in order in one event loop (the client is bound to it)."""
    def register(f):
        checks.append((name, f))
        return f

    return register


def agent(model, **settings):
    return Agent(name="weather", instructions="Answer with the tools.", model=model,
                 tools=[get_weather, to_fahrenheit], model_settings=ModelSettings(**settings))


WANT = [("get_weather", {"city": "Paris"}), ("to_fahrenheit", {"celsius": 21})]
MODELS = {
    "responses": lambda: OpenAIResponsesModel(model="m", openai_client=client),
    "chat completions": lambda: OpenAIChatCompletionsModel(model="m", openai_client=client),
}

for api, make in MODELS.items():
    @check(f"agents SDK over {api}: two tools called in turn, then the answer")
    async def _():
        calls.clear()
        result = await Runner.run(agent(make()), "weather")
        assert calls == WANT, calls
        assert result.final_output == "answer", result.final_output

    @check(f"agents SDK over {api}, streamed: the same calls and answer")
    async def _():
        calls.clear()
        result = Runner.run_streamed(agent(make()), "weather")
        kinds = set()
        async for event in result.stream_events():
            kinds.add(event.type)
        assert calls == WANT, calls
        assert result.final_output == "answer", result.final_output
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds, kinds


@check("agents SDK forcing a call (required, or a tool by name) where the model would think")
async def _():
    # On "hi" the model thinks and answers. Forced, its first turn is a parsed call (the SDK
    # then resets tool_choice, and the run goes on as the tools lead). "required" lets it pick
    # either tool (the scripted model scores both alike, so sampling decides which).
    calls.clear()
    result = await Runner.run(agent(MODELS["chat completions"](), tool_choice="required"), "hi")
    assert calls and calls[0][0] in ("get_weather", "to_fahrenheit"), calls
    assert result.final_output == "answer", result.final_output
    calls.clear()
    result = await Runner.run(agent(MODELS["chat completions"](), tool_choice="get_weather"), "hi")
    assert calls == WANT, calls
    assert result.final_output == "answer", result.final_output
    calls.clear()
    assert (await Runner.run(agent(MODELS["chat completions"]()), "hi")).final_output == "answer"
    assert calls == [], calls


async def main():
    for name, f in checks:
        await f()
        print(f"ok: {name}", flush=True)
    print(f"{len(checks)} passed, 0 failed")


asyncio.run(main())
