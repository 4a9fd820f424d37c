"""What one request's restore from host RAM costs a request that decodes meanwhile (issue 58, item 4), in one process.

    python -m bench.restore_beside [--words 1600] [--repeats 2] [--rounds 3] [--out bench/results/restore_beside.json]

A prompt of about `--words` tokens is computed once and sent to host RAM (tier H); then, while another request
decodes `--decode` tokens, the prompt is asked again and comes back from H, `--rounds` times on one server. Three
ways of restoring it, each on a fresh in-process server, in turns (`--repeats` servers of each):

- `staged`: `--cache-restore-beside auto` (the default): the cells taken on the engine thread, the K and V written on
  a thread of their own beside the decode steps (native/src/llama-state-staged.h);
- `pieces`: `--cache-restore-beside off`: a piece of `--cache-restore-step` KiB (default 8192) between decode steps;
- `whole`: `--cache-restore-step 0`: the whole copy at admission.

The servers take the longest cached prefix (`--cache-route longest`): a restore is what is measured, even where the
cost model would compute the prompt instead (a tiny model computes faster than it restores).

Per restore: the decoding request's longest gap between two tokens while the restore was under way (from the second
request's submission to its first token) against its median gap before it, the restored request's time to first
token, the engine thread's longest cache step by kind, and the staged restore's engine-thread part
(`/cache/stats` `restores_staged.max_stage_ms`). Written to `--out`; docs/cache-policies.md summarises it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from server import bootstrap
from server.engine.sampling_params import SamplingParams
from server.engine.sequence import Finished, GenerationRequest, TextDelta
from server.settings import ServerSettings

MODES: dict[str, dict[str, Any]] = {"staged": {}, "pieces": {"cache_restore_beside": "off"},
                                    "whole": {"cache_restore_step": 0}}
WORDS = "pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch panel".split()


class Stream:
    """One request submitted to the engine: the time of each step's text, its end."""

    def __init__(self, model, tokens: list[int], max_tokens: int):
        self.times: list[float] = []
        self.final: Finished | None = None
        self.submitted = time.perf_counter()
        self.done = threading.Event()
        req = GenerationRequest(prompt_tokens=tokens, sampling=SamplingParams(temperature=0), max_tokens=max_tokens,
                                ignore_eos=True)
        model.engine.submit(req, self._sink)

    def _sink(self, ev) -> None:
        if isinstance(ev, TextDelta):
            self.times.append(time.perf_counter())
        elif isinstance(ev, Finished):
            self.final = ev
            self.done.set()

    def wait(self) -> Finished:
        if not self.done.wait(600):
            raise SystemExit("a request did not finish in 10 minutes")
        assert self.final is not None
        return self.final


def one_run(mode: str, a: argparse.Namespace) -> list[dict]:
    """One fresh server in `mode`: the prompt computed, then `--rounds` times sent to host RAM and restored beside a
    decoding request (the first round's buffers are fresh memory; later rounds' may be kept ones)."""
    model = bootstrap.load(ServerSettings(model=a.model, parallel=2, ctx_size=8192, batch_size=512,
                                          threads=a.threads, cache_tiers=("A", "S", "H"), cache_ram=1024,
                                          cache_route="longest",  # always the restore, whatever it is estimated at
                                          spec_type="none", **MODES[mode]))
    rows = []
    router = model.router
    assert router is not None  # tiers A, S and H are on
    try:
        rt = model.runtime
        prompt = rt.tokenize("Plant log. " + " ".join(WORDS[i % len(WORDS)] for i in range(a.words)),
                             add_special=True, parse_special=False)
        other = rt.tokenize("A long poem about pumps, valves and the night shift:", add_special=True,
                            parse_special=False)
        Stream(model, prompt, 1).wait()  # computed
        for round_ in range(a.rounds):
            before_stats = router.stats()
            model.engine.run_exclusive(router.drop_device_copies)  # its KV goes to host RAM
            decoding = Stream(model, other, a.decode)
            while len(decoding.times) < 12:  # the decode steps run
                time.sleep(0.005)
            restored = Stream(model, prompt, 1)
            final = restored.wait()
            first = restored.times[0] if restored.times else time.perf_counter()
            decoding.wait()
            stats = router.stats()
            rows.append(row(mode, round_, prompt, final, restored, first, decoding.times, before_stats, stats))
    finally:
        model.close()
    return rows


def row(mode: str, round_: int, prompt: list[int], final: Finished, restored: Stream, first: float,
        times: list[float], before_stats: dict, stats: dict) -> dict:
    before = [b - a_ for a_, b in zip(times, times[1:], strict=False) if b <= restored.submitted]
    during = [b - a_ for a_, b in zip(times, times[1:], strict=False) if b > restored.submitted and a_ < first]
    cache = final.cache
    staged, staged0 = stats["restores_staged"], before_stats["restores_staged"]
    return {"mode": mode, "round": round_, "prompt_tokens": len(prompt), "source": cache.source if cache else None,
            "reused_tokens": final.cached_tokens,
            "ttft_ms": round((first - restored.submitted) * 1000.0, 2),
            "decode_gap_ms_median_before": round(statistics.median(before) * 1000.0, 2) if before else None,
            "decode_gap_ms_max_during": round(max(during) * 1000.0, 2) if during else None,
            # the server's longest so far (a round's own when it is the longest)
            "max_step_cache_ms_by_kind": stats["engine_thread"]["max_step_cache_ms_by_kind"],
            "staged_restores": staged["restores"] - staged0["restores"], "max_stage_ms": staged["max_stage_ms"],
            "writes_waited": staged["writes_waited"],
            "pieces": stats["restores_in_pieces"]["pieces"] - before_stats["restores_in_pieces"]["pieces"],
            "fallbacks": stats["fallbacks"] - before_stats["fallbacks"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.restore_beside", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--words", type=int, default=1600, help="words of the restored prompt (about as many tokens)")
    p.add_argument("--decode", type=int, default=120, help="tokens the other request decodes")
    p.add_argument("--repeats", type=int, default=2, help="fresh servers per mode, in turns")
    p.add_argument("--rounds", type=int, default=3, help="restores per server")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", type=Path, default=Path("bench/results/restore_beside.json"))
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    runs = []
    for _ in range(a.repeats):
        for mode in modes:
            for r in one_run(mode, a):
                runs.append(r)
                print(json.dumps(r), flush=True)
    summary = {}
    for mode in modes:
        for label, mine in (("first", [r for r in runs if r["mode"] == mode and r["round"] == 0]),
                            ("later", [r for r in runs if r["mode"] == mode and r["round"] > 0])):
            if not mine:
                continue
            summary[f"{mode} {label}"] = {
                **{k: statistics.median(r[k] for r in mine if r[k] is not None)
                   for k in ("ttft_ms", "decode_gap_ms_median_before", "decode_gap_ms_max_during")},
                "restores": len(mine), "sources": sorted({str(r["source"]) for r in mine})}
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {"restore_step_ms_max": max(r["max_step_cache_ms_by_kind"].get("restore", 0.0) for r in mine),
                         "admission_step_ms_max": max(r["max_step_cache_ms_by_kind"].get("admission", 0.0)
                                                      for r in mine),
                         "stage_ms_max": max(r["max_stage_ms"] for r in mine),
                         "writes_waited": max(r["writes_waited"] for r in mine)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"words": a.words, "decode": a.decode, "threads": a.threads, "repeats": a.repeats,
                                 "rounds": a.rounds,
                                 "command": " ".join(["python -m bench.restore_beside", *argv]),
                                 "summary": summary, "runs": runs}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
