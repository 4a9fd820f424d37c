"""Speculative decoding on the real engine (embedded model): what the target gives with drafting is what it gives
without: greedy for every n-gram drafter, with a grammar, with stop strings, with logprobs; sampled with a seed
(verification draws from the same chain, one draw per token emitted, so a seed gives the same tokens); and the
draft model that is the target itself has its drafts accepted. A planted fault (a verifier that keeps drafted
tokens the target did not pick) is caught by the same comparison.

"The same" is tests/server/near_tie.py's rule: equal, or parting where the two runs' own log-probabilities put
the other's choice within NEAR_TIE_NATS. A verified row is computed in a batch of k + 1 rows of its sequence, a
plain decode in one row: llama.cpp's sums differ in their last bits between those shapes (F16 accumulators,
activations quantized per batch), so at a near-tie the greedy choice may flip (seen here: 41 against 37 at
-1.78 / -1.92 nats drafted, -1.87 / -1.84 plain). A wrong verification keeps a token the target did not pick,
which is not a near-tie."""

from __future__ import annotations

import threading

import pytest

from tests.cores import model_threads
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model

CODE = "\n".join(f"def func_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(8))
REWRITE = ("<|im_start|>user\nRewrite this Python file, renaming func_3 to triple. Output the whole file.\n\n"
           f"{CODE}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def runtime():
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.model_file import embedded_model_path

    rt = LlamaRuntime(RuntimeConfig(embedded_model_path(), n_ctx=2048, n_batch=256, n_seq_max=2,
                                    n_threads=model_threads(), n_threads_batch=model_threads(), paged_attn="auto",
                                    page_placement="owned"))
    yield rt
    rt.close()


def speculator(runtime, types=("ngram-map-k",), adaptive=False, **config):
    from server.engine.speculative.config import SpecConfig
    from server.engine.speculative.drafter import Drafter
    from server.engine.speculative.policy import DraftPolicy
    from server.engine.speculative.speculator import Speculator

    drafter = Drafter(SpecConfig(types=types, adaptive=adaptive, **config), 2, ctx_tgt=runtime.ctx,
                      n_ctx=runtime.n_ctx, n_batch=runtime.n_batch, n_threads=model_threads())
    return Speculator(drafter, DraftPolicy(adaptive=adaptive))


def generate(runtime, spec, prompt: str = REWRITE, max_tokens: int = 96, **fields):
    """(tokens, text, Finished, logprobs) of one request through the engine, drafting with `spec` (None: without);
    greedy requests report 5 alternatives per token for the near-tie rule."""
    from server.engine.engine import Engine
    from server.engine.runner import LlamaRunner, SlotReuseOnly
    from server.engine.sampling_params import SamplingParams
    from server.engine.scheduler import Scheduler
    from server.engine.sequence import Finished, GenerationRequest, TextDelta
    from server.engine.slots import SlotPool

    runtime.seq_rm(0)
    sampling = SamplingParams(**{k: fields.pop(k) for k in list(fields) if k in SamplingParams.__dataclass_fields__})
    if sampling.greedy:
        fields.setdefault("logprobs", 5)
    request = GenerationRequest(prompt_tokens=runtime.tokenize(prompt, add_special=False, parse_special=True),
                                sampling=sampling, max_tokens=max_tokens, **fields)
    engine = Engine(LlamaRunner(runtime, SlotReuseOnly(runtime, reuse=False), spec),
                    Scheduler(SlotPool([0]), max_batch_tokens=runtime.n_batch, max_waiting=2, reuse=False))
    logprobs: list = []
    text: list[str] = []
    done = threading.Event()
    box: list[Finished] = []

    def sink(event):
        if isinstance(event, TextDelta):
            text.append(event.text)
            logprobs.extend(event.logprobs)
        else:
            box.append(event)
            done.set()

    engine.start()
    try:
        seq = engine.submit(request, sink)
        assert done.wait(300), "the request did not finish"
    finally:
        engine.stop()
        if spec is not None:
            spec.close()
    return list(seq.output), "".join(text), box[0], logprobs


def steps(result) -> list:
    """The tokens a request emitted (generate's result), each with its row's log-probabilities: the near-tie
    rule's input. An emitted token its row did not rank gets -inf (a token the target did not give)."""
    from tests.server.near_tie import Step

    tokens, logprobs = result[0], result[3]  # (a stop string's own tokens have no log-probabilities: cut there)
    out = []
    for token, lp in zip(tokens, logprobs):
        top = dict(lp.top)
        out.append(Step(token, top.get(token, lp.logprob if lp.token == token else float("-inf")), top))
    return out


def assert_same_answer(plain, drafted) -> None:
    """`plain` and `drafted` (generate's results) are equal or part at a near-tie."""
    from tests.server.near_tie import parting_problem

    problem = parting_problem(steps(plain), steps(drafted))
    assert problem is None, problem


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
def test_greedy_output_is_the_targets_with_every_ngram_drafter(runtime, kind):
    config = {"ngram_mod": (8, 1, 16)} if kind == "ngram-mod" else {}  # llama.cpp's n-match 24 needs long repeats
    plain = generate(runtime, None, temperature=0.0)
    drafted = generate(runtime, speculator(runtime, (kind,), **config), temperature=0.0)
    assert_same_answer(plain, drafted)
    fin = drafted[2]
    assert fin.draft_n > 0 and 0 < fin.draft_n_accepted <= fin.draft_n
    assert plain[2].draft_n == 0


def test_the_adaptive_default_drafts_the_same_text(runtime):
    """On an answer that copies its prompt (bench.speculative's agent edit: the embedded model writes the file back)
    the adaptive default drafts, and the text is the undrafted one. (REWRITE's answer renames every function and
    changes the constants: it copies too little for a policy that backs off when the drafter has nothing.)"""
    from harness.workloads.drafting import messages

    prompt = f"<|im_start|>user\n{messages('edit', 3)[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    plain = generate(runtime, None, prompt=prompt, temperature=0.0)
    drafted = generate(runtime, speculator(runtime, ("auto",), adaptive=True), prompt=prompt, temperature=0.0)
    assert_same_answer(plain, drafted)
    assert drafted[2].draft_n_accepted > 0


def test_a_grammar_constrains_drafted_tokens_as_sampled_ones(runtime):
    from server.engine.sampling_params import Constraint

    grammar = 'root ::= ("def " [a-z_0-9]+ "(x):\\n    return x * " [0-9]+ " + " [0-9]+ "\\n\\n")+'
    plain = generate(runtime, None, temperature=0.0, constraint=Constraint(grammar))
    spec = speculator(runtime, ngram_map_k=(3, 16, 1))
    drafted = generate(runtime, spec, temperature=0.0, constraint=Constraint(grammar))
    assert_same_answer(plain, drafted)
    assert drafted[1].startswith("def ") and drafted[2].draft_n_accepted > 0


def test_a_stop_string_inside_a_draft_ends_the_answer_where_it_would(runtime):
    plain = generate(runtime, None, temperature=0.0, stop=["func_5"])
    drafted = generate(runtime, speculator(runtime), temperature=0.0, stop=["func_5"])
    assert_same_answer(plain, drafted)
    fin = drafted[2]
    assert fin.finish_reason == plain[2].finish_reason == "stop" and "func_5" not in drafted[1]
    assert fin.stop_word == "func_5" and fin.draft_n_accepted > 0


def test_logprobs_are_reported_for_every_drafted_token(runtime):
    """Each token's log-probability is read from its own verified row: as without drafting, but for the last bits
    of the batch shape (a drafted row is computed among k + 1 rows)."""
    plain = generate(runtime, None, temperature=0.0, max_tokens=48)
    drafted = generate(runtime, speculator(runtime), temperature=0.0, max_tokens=48)
    assert len(drafted[3]) == len(drafted[0]) and drafted[2].draft_n_accepted > 0
    assert_same_answer(plain, drafted)
    for a, b in zip(drafted[3], plain[3]):
        if a.token != b.token:
            break
        assert a.logprob == pytest.approx(b.logprob, abs=0.1)


def test_sampled_output_with_a_seed_is_the_targets(runtime):
    """Verification samples each row with the request's own chain: one draw per emitted token, as without drafts,
    so the same seed gives the same tokens, and so the target's distribution over seeds. A draw that falls within
    the last bits' difference of a boundary between two tokens may pick the other (rare): 5 of 6 seeds must give
    the very same tokens, and drafts must have been accepted."""
    same, accepted = 0, 0
    for seed in range(1, 7):
        plain = generate(runtime, None, temperature=0.7, seed=seed, max_tokens=64)
        drafted = generate(runtime, speculator(runtime, ngram_map_k=(3, 16, 1)), temperature=0.7, seed=seed,
                           max_tokens=64)
        same += drafted[0] == plain[0]
        accepted += drafted[2].draft_n_accepted
    assert same >= 5 and accepted > 0


def test_the_target_as_its_own_draft_model_has_every_draft_accepted(runtime):
    from server.model_file import embedded_model_path

    plain = generate(runtime, None, temperature=0.0, max_tokens=48)
    spec = speculator(runtime, ("draft-simple",), draft_model=embedded_model_path(), draft_n_max=4)
    drafted = generate(runtime, spec, temperature=0.0, max_tokens=48)
    assert_same_answer(plain, drafted)
    fin = drafted[2]
    assert fin.draft_n > 0 and fin.draft_n_accepted >= 0.95 * fin.draft_n


def test_a_verifier_that_keeps_what_the_target_did_not_pick_is_caught(runtime, monkeypatch):
    """The planted fault: drafted tokens kept whatever the target picks. The same comparison must fail."""
    from server.engine import runner as runner_module

    plain = generate(runtime, None, temperature=0.0)
    original = runner_module.LlamaRunner._verify

    def keeps_the_draft(self, item, row0, batch_index, best, n_rows):
        picked = original(self, item, row0, batch_index, best, n_rows)
        if item.draft and len(picked) <= len(item.draft):  # a rejection: keep the draft instead
            wrong = item.draft[len(picked) - 1]
            return picked[:-1] + [wrong]
        return picked

    monkeypatch.setattr(runner_module.LlamaRunner, "_verify", keeps_the_draft)
    faulty = generate(runtime, speculator(runtime, ("ngram-simple",)), temperature=0.0)
    from tests.server.near_tie import parting_problem

    assert faulty[0] != plain[0] and parting_problem(steps(plain), steps(faulty)) is not None
