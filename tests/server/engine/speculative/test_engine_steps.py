"""The engine with a runner whose steps accept drafts: several tokens per step reach the request one by one,
a stop inside them ends it there, and the KV kept is what verification kept (simulated runner, no llama.cpp)."""

from __future__ import annotations

from server.engine.engine import Engine
from server.engine.sampling_params import SamplingParams
from server.engine.scheduler import Scheduler, StepItem
from server.engine.sequence import GenerationRequest
from server.engine.slots import SlotPool
from tests.server.engine.sim_runner import EOG, SimRunner
from tests.server.engine.test_scheduler import Collector, run_until_idle


class DraftingRunner(SimRunner):
    """Each decode step 'drafts' the next scripted tokens and accepts all but the last of each scripted group:
    the group comes back whole, as a verified draft's accepted tokens plus the token sampled after them."""

    def __init__(self, groups: list[list[int]]):
        super().__init__()
        self.groups = groups
        self.kept: list[int] = []

    def forward(self, items: list[StepItem]) -> list[list[int] | None]:
        out: list[list[int] | None] = []
        for item in items:
            if not item.sample:
                out.append(None)
                continue
            group = self.groups.pop(0)
            if len(item.tokens) == 1 and len(group) > 1:  # a decode: its draft was group[:-1], all accepted
                item.draft = group[:-1]
                item.tokens = [item.tokens[0], *item.draft]
                item.kept = len(group)
                self.kept.append(item.kept)
            out.append(group)
        return out


def engine_with(groups, *, max_tokens=20, stop=()):
    runner = DraftingRunner(groups)
    engine = Engine(runner, Scheduler(SlotPool([0]), max_batch_tokens=64, max_waiting=4, reuse=False))
    out = Collector()
    seq = engine.submit(GenerationRequest(prompt_tokens=[1, 3, 5], sampling=SamplingParams(temperature=0),
                                          max_tokens=max_tokens, stop=list(stop)), out)
    run_until_idle(engine)
    return seq, out, runner


def test_a_steps_tokens_reach_the_request_in_order_and_the_kv_follows():
    seq, out, runner = engine_with([[10], [11, 12, 13], [14, EOG]])
    assert out.text == "<10><11><12><13><14>"
    assert out.final.finish_reason == "stop" and out.final.completion_tokens == 5
    # the prompt, then 10 and the drafted 11, 12 (13 sampled, not yet computed), then 13 and 14: KV of them all
    assert runner.kept == [3, 2]
    assert seq.n_past == len(seq.prompt) + len(seq.output)


def test_max_tokens_inside_an_accepted_draft_stops_there_and_cuts_the_kv_back():
    seq, out, _ = engine_with([[10], [11, 12, 13, 14, 15]], max_tokens=3)
    assert out.text == "<10><11><12>" and out.final.finish_reason == "length"
    assert seq.n_past <= len(seq.prompt) + len(seq.output)


def test_a_stop_string_inside_an_accepted_draft_ends_the_request_without_it():
    seq, out, _ = engine_with([[10], [11, 12, 13, 14, 15]], stop=["<12>"])
    assert out.text == "<10><11>" and out.final.finish_reason == "stop"
    assert seq.n_past <= len(seq.prompt) + len(seq.output)


def test_end_of_generation_inside_an_accepted_draft_is_not_output():
    seq, out, _ = engine_with([[10], [11, EOG, 13]])
    assert out.text == "<10><11>" and out.final.completion_tokens == 2
    assert seq.n_past == len(seq.prompt) + len(seq.output)
