"""Speculative decoding on the real engine (embedded model): what the target gives with drafting is what it gives
without, token for token: greedy for every n-gram drafter, with a grammar, with stop strings, with logprobs, paged
or not; sampled with a seed (verification draws from the same chain, one draw per token emitted, so a seed gives
the same tokens); and the draft model that is the target itself has every drafted token accepted. A planted fault
(a verifier that keeps drafted tokens the target did not pick) is caught by the same comparison."""

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
    """(tokens, text, Finished) of one request through the engine, drafting with `spec` (None: without)."""
    from server.engine.engine import Engine
    from server.engine.runner import LlamaRunner, SlotReuseOnly
    from server.engine.sampling_params import SamplingParams
    from server.engine.scheduler import Scheduler
    from server.engine.sequence import Finished, GenerationRequest, TextDelta
    from server.engine.slots import SlotPool

    runtime.seq_rm(0)
    sampling = SamplingParams(**{k: fields.pop(k) for k in list(fields) if k in SamplingParams.__dataclass_fields__})
    request = GenerationRequest(prompt_tokens=runtime.tokenize(prompt, add_special=False, parse_special=True),
                                sampling=sampling, max_tokens=max_tokens, **fields)
    engine = Engine(LlamaRunner(runtime, SlotReuseOnly(runtime, reuse=False), spec),
                    Scheduler(SlotPool([0]), max_batch_tokens=runtime.n_batch, max_waiting=2, reuse=False))
    tokens: list[int] = []
    logprobs: list = []
    text: list[str] = []
    done = threading.Event()
    box: list[Finished] = []

    def sink(event):
        if isinstance(event, TextDelta):
            tokens.extend(event.tokens)
            text.append(event.text)
            logprobs.extend(event.logprobs)
        else:
            box.append(event)
            done.set()

    engine.start()
    try:
        engine.submit(request, sink)
        assert done.wait(300), "the request did not finish"
    finally:
        engine.stop()
        if spec is not None:
            spec.close()
    return tokens, "".join(text), box[0], logprobs


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
def test_greedy_output_is_the_targets_with_every_ngram_drafter(runtime, kind):
    config = {"ngram_mod": (8, 1, 16)} if kind == "ngram-mod" else {}  # llama.cpp's n-match 24 needs long repeats
    plain, plain_text, plain_fin, _ = generate(runtime, None, temperature=0.0)
    drafted, text, fin, _ = generate(runtime, speculator(runtime, (kind,), **config), temperature=0.0)
    assert drafted == plain and text == plain_text
    assert fin.finish_reason == plain_fin.finish_reason and fin.completion_tokens == plain_fin.completion_tokens
    assert fin.draft_n > 0 and 0 < fin.draft_n_accepted <= fin.draft_n
    assert plain_fin.draft_n == 0


def test_the_adaptive_default_drafts_the_same_text(runtime):
    plain, *_ = generate(runtime, None, temperature=0.0)
    drafted, _, fin, _ = generate(runtime, speculator(runtime, ("auto",), adaptive=True), temperature=0.0)
    assert drafted == plain and fin.draft_n_accepted > 0


def test_a_grammar_constrains_drafted_tokens_as_sampled_ones(runtime):
    from server.engine.sampling_params import Constraint

    grammar = 'root ::= ("def " [a-z_0-9]+ "(x):\\n    return x * " [0-9]+ " + " [0-9]+ "\\n\\n")+'
    plain, plain_text, *_ = generate(runtime, None, temperature=0.0, constraint=Constraint(grammar))
    spec = speculator(runtime, ngram_map_k=(3, 16, 1))
    drafted, text, fin, _ = generate(runtime, spec, temperature=0.0, constraint=Constraint(grammar))
    assert drafted == plain and text == plain_text and text.startswith("def ")
    assert fin.draft_n_accepted > 0


def test_a_stop_string_inside_a_draft_ends_the_answer_where_it_would(runtime):
    plain, plain_text, plain_fin, _ = generate(runtime, None, temperature=0.0, stop=["func_5"])
    drafted, text, fin, _ = generate(runtime, speculator(runtime), temperature=0.0, stop=["func_5"])
    assert text == plain_text and fin.finish_reason == plain_fin.finish_reason == "stop"
    assert fin.stop_word == "func_5" and fin.draft_n_accepted > 0


def test_logprobs_are_reported_for_every_drafted_token(runtime):
    plain, _, _, plain_lp = generate(runtime, None, temperature=0.0, logprobs=2, max_tokens=48)
    drafted, _, fin, lp = generate(runtime, speculator(runtime), temperature=0.0, logprobs=2, max_tokens=48)
    assert drafted == plain and len(lp) == len(plain_lp) == len(plain) and fin.draft_n_accepted > 0
    for a, b in zip(lp, plain_lp):
        assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=2e-2)


def test_sampled_output_with_a_seed_is_the_targets(runtime):
    """Verification samples each row with the request's own chain: one draw per emitted token, as without drafts,
    so the same seed gives the same tokens (and so the same distribution over seeds)."""
    for seed in (1, 2, 3):
        plain, *_ = generate(runtime, None, temperature=0.7, seed=seed, max_tokens=64)
        drafted, _, fin, _ = generate(runtime, speculator(runtime), temperature=0.7, seed=seed, max_tokens=64)
        assert drafted == plain, f"seed {seed}"


def test_the_target_as_its_own_draft_model_has_every_draft_accepted(runtime):
    from server.model_file import embedded_model_path

    plain, *_ = generate(runtime, None, temperature=0.0, max_tokens=48)
    spec = speculator(runtime, ("draft-simple",), draft_model=embedded_model_path(), draft_n_max=4)
    drafted, _, fin, _ = generate(runtime, spec, temperature=0.0, max_tokens=48)
    assert drafted == plain
    assert fin.draft_n > 0 and fin.draft_n_accepted >= 0.95 * fin.draft_n


def test_a_verifier_that_keeps_what_the_target_did_not_pick_is_caught(runtime, monkeypatch):
    """The planted fault: drafted tokens kept whatever the target picks. The same comparison must fail."""
    from server.engine import runner as runner_module

    plain, *_ = generate(runtime, None, temperature=0.0)
    original = runner_module.LlamaRunner._verify

    def keeps_the_draft(self, item, row0, batch_index, best, n_rows):
        picked = original(self, item, row0, batch_index, best, n_rows)
        if item.draft and len(picked) <= len(item.draft):  # a rejection: keep the draft instead
            wrong = item.draft[len(picked) - 1]
            return picked[:-1] + [wrong]
        return picked

    monkeypatch.setattr(runner_module.LlamaRunner, "_verify", keeps_the_draft)
    faulty, *_ = generate(runtime, speculator(runtime, ("ngram-simple",)), temperature=0.0)
    assert faulty != plain
