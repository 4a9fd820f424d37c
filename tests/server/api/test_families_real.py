"""Real model families through the real server: random-weight models carrying a family's own
tokenizer and chat template (harness/models/family_model.py), a GBNF grammar forcing exactly what a model
of that family writes, and the OpenAI API's answer read back, streamed and not: reasoning apart
from the content, tool calls parsed the family's way, finish_reason "tool_calls"."""

from __future__ import annotations

import json

import httpx
import pytest

from harness.models.family_model import write_family_model
from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]

# family -> (what its model writes: reasoning, then a call of get_weather(city=Paris); reasoning expected)
FORCED = {
    "qwen3": ('<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "The user wants weather."),
    "gpt-oss": ('<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', "The user wants weather."),
    "mistral-nemo": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]', ""),
}


def gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'root ::= "{escaped}"'


@pytest.fixture(scope="module", params=sorted(FORCED))
def family_server(request, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"family-{request.param}")
    model = write_family_model(request.param, work / f"{request.param}.gguf")
    server = start_server(work, "--model", str(model), "--parallel", "1", "--ctx-size", "1024",
                          "--batch-size", "256")
    yield request.param, server
    stop_server(server)


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", json=body, timeout=300)


def _body(family: str, **extra) -> dict:
    return {"messages": ASK, "tools": [WEATHER], "grammar": gbnf_literal(FORCED[family][0]), "max_tokens": 400,
            "temperature": 0, **extra}


def test_a_forced_reply_comes_back_as_reasoning_and_a_tool_call(family_server):
    family, server = family_server
    r = _post(server, _body(family))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls", message
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert not (message["content"] or "").strip()
    assert (message.get("reasoning_content") or "").strip() == FORCED[family][1]


def test_the_streamed_reply_is_the_same_and_leaks_no_markup(family_server):
    family, server = family_server
    r = _post(server, _body(family, stream=True))
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    content = "".join(d.get("content") or "" for d in deltas)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert finish == ["tool_calls"]
    assert not content.strip(), content
    assert reasoning.strip() == FORCED[family][1]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads("".join(c["function"].get("arguments") or "" for c in calls)) == {"city": "Paris"}


def test_the_history_with_reasoning_and_the_call_renders_and_extends_the_prompt(family_server):
    """The next call of the agent loop: the reply (reasoning, call) and its result go back; the
    prompt of call k+1 starts with call k's prompt, so its prefix is reused."""
    family, server = family_server
    first = _post(server, _body(family)).json()
    message = first["choices"][0]["message"]
    history = ASK + [{"role": "assistant", "content": message["content"],
                      "reasoning_content": message.get("reasoning_content"), "tool_calls": message["tool_calls"]},
                     {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": '{"temp_c": 12}'}]
    answer_text = "<|channel|>final<|message|>It is 12 C." if family == "gpt-oss" else "It is 12 C."
    r = _post(server, {"messages": history, "tools": [WEATHER], "grammar": gbnf_literal(answer_text),
                       "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["choices"][0]["message"]["content"] == "It is 12 C."
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] * 0.8


# family -> (a plain answer as its model writes it, the reasoning expected apart)
PLAIN = {
    "qwen3": ("<think>\nHmm.\n</think>\n\nIt is sunny.", "Hmm."),
    "gpt-oss": ("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
                "Hmm."),
    "mistral-nemo": ("It is sunny.", ""),
}


def test_a_plain_answer_keeps_its_reasoning_apart_unless_reasoning_format_none(family_server):
    family, server = family_server
    text, reasoning = PLAIN[family]
    body = {"messages": ASK, "grammar": gbnf_literal(text), "max_tokens": 60, "temperature": 0}
    message = _post(server, body).json()["choices"][0]["message"]
    assert message["content"].strip() == "It is sunny."
    assert (message.get("reasoning_content") or "").strip() == reasoning
    raw = _post(server, {**body, "reasoning_format": "none"}).json()["choices"][0]["message"]
    assert "reasoning_content" not in raw and raw["content"].strip().endswith("It is sunny.")
    if reasoning:
        assert "Hmm." in raw["content"]


def test_chat_template_kwargs_reach_the_template(family_server):
    family, server = family_server
    on = httpx.post(server.base_url + "/apply-template", json={"messages": ASK}, timeout=60).json()["prompt"]
    off = httpx.post(server.base_url + "/apply-template",
                     json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}, timeout=60).json()
    if family == "qwen3":  # Qwen3's switch closes an empty thinking block in the prompt
        assert off["prompt"].startswith(on) and "<think>\n\n</think>" in off["prompt"][len(on):]
    else:
        assert off["prompt"] == on
    bad = httpx.post(server.base_url + "/apply-template",
                     json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": "no"}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


FINAL = {"qwen3": "It is 12 C.", "gpt-oss": "<|channel|>final<|message|>It is 12 C.", "mistral-nemo": "It is 12 C."}


def test_a_langgraph_react_loop_over_langchain_openai_completes_a_tool_round_trip(family_server):
    """LangChain's ChatOpenAI with bind_tools in a LangGraph loop (agent -> ToolNode -> agent): the
    call comes back as a LangChain tool call, the tool runs, and the answer ends the loop; the
    reasoning never reaches a message's content. The grammar stands in for the model's decision
    (a call first, then the answer), which random weights cannot make."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    family, server = family_server
    asked: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city"""
        asked.append(city)
        return '{"temp_c": 12}'

    llm = ChatOpenAI(base_url=server.v1, api_key="unused", model="family", temperature=0, max_tokens=400)

    def agent(state: MessagesState) -> dict:
        after_tool = isinstance(state["messages"][-1], ToolMessage)
        text = FINAL[family] if after_tool else FORCED[family][0]
        model = llm.bind_tools([get_weather]).bind(extra_body={"grammar": gbnf_literal(text)})
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    messages = graph.compile().invoke({"messages": [("user", "Weather in Paris?")]}, {"recursion_limit": 6})["messages"]

    assert asked == ["Paris"]
    replies = [m for m in messages if isinstance(m, AIMessage)]
    assert [len(m.tool_calls) for m in replies] == [1, 0]
    assert replies[0].tool_calls[0]["args"] == {"city": "Paris"}
    assert replies[-1].content == "It is 12 C."
    assert all("weather." not in str(m.content) and "<" not in str(m.content) for m in replies)


def test_drafting_changes_nothing_in_a_familys_reply(family_server):
    """The server drafts by default (speculative decoding): the family's forced reply is the same with drafting
    off for the request, and what it drafted was verified under the grammar."""
    family, server = family_server
    drafted = _post(server, _body(family)).json()
    plain = _post(server, _body(family, **{"speculative.n_max": 0})).json()

    def reply(answer: dict) -> tuple:  # the message but for the tool calls' ids, which are drawn per answer
        m = answer["choices"][0]["message"]
        return m.get("content"), m.get("reasoning_content"), [c["function"] for c in m.get("tool_calls") or []]

    assert reply(drafted) == reply(plain)
    assert plain["timings"]["draft_n"] == 0
    assert drafted["timings"]["draft_n_accepted"] <= drafted["timings"]["draft_n"]
