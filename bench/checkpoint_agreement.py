"""Teacher-forced agreement, cache on against cache off, on models with sliding-window or recurrent
layers (issue 32's correctness target: >= 99.5% top-1 on prefixes restored from each of A, S, H, D).

For each model: a long trunk is computed once on one sequence, checkpoints taken where the engine
takes them (server/cache/checkpoints.stops); then a branch leaves the trunk at `--branch` tokens and
its prefix is obtained as each source would give it, on a fresh sequence each time:

- A: the trunk's own sequence resumed (SlotStates.resume: cut back, or its checkpoint restored);
- S: the trunk's cells shared with seq_cp and the checkpoint restored over them;
- H: the full-attention KV extracted as segments (KVOps.extract) and restored with the checkpoint;
- D: the same segments written to a segment file and read back (segment_format), then restored;
- none: no cache, the branch's prefix computed again on the trunk's sequence (after A): the noise
  floor, what the placement of cells alone does to the logits (random-weight Gemma amplifies it);

and the branch's tokens plus a reference continuation are fed (teacher forcing) after it. Every
position's top-1 prediction is compared with the same tokens computed from nothing on another
sequence of the same context, and max |logit difference| reported.

    python -m bench.checkpoint_agreement --model var/models/gemma3-swa-bench6.gguf [--trunk 1500]
        [--branch 1100] [--forced 256] [--out bench/results/checkpoint_agreement]

Models come from `python -m bench.synth_swa_hybrid` (e.g. `--arch gemma3 --shape bench --n-layer 6`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from server.cache.checkpointed_slots import SlotStates
from server.cache.checkpoints import ModelMemory, StateCheckpoint, stops
from server.cache.kv_ops import KVOps
from server.cache.segment_format import encode_segment, read_segment_file, write_segment_file
from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig
from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool
from server.engine.slots import Slot

TRUNK_SEQ, REF_SEQ = 0, 1  # slots; the pool's scratch ids follow


def decode_run(rt: LlamaRuntime, seq: int, tokens: list[int], pos0: int, *, logits: bool) -> np.ndarray | None:
    """Feed `tokens` at positions pos0.. in batches; every row's logits when asked."""
    rows = []
    for s in range(0, len(tokens), rt.n_batch):
        part = tokens[s:s + rt.n_batch]
        rt.decode([BatchEntry(t, pos0 + s + i, seq, logits) for i, t in enumerate(part)])
        if logits:
            rows.append(np.array(rt.logits_matrix(len(part))))
    return np.concatenate(rows) if logits else None


def run(model: Path, trunk_len: int, branch_at: int, forced: int, every: int, threads: int) -> dict:
    rt = LlamaRuntime(RuntimeConfig(model, n_ctx=4 * (trunk_len + forced + 64), n_batch=256, n_seq_max=6,
                                    n_threads=threads, n_threads_batch=threads, flash_attn=None, paged_attn="off"))
    memory = ModelMemory.of(rt.info)
    ids = SequenceIdPool(SequenceIdLayout(slots=4, owners=0, scratch=2))
    kv = KVOps(rt, ids, partial_state=True)
    rng = np.random.default_rng(0)
    vocab = min(rt.info.n_vocab, 40000)
    trunk = rng.integers(100, vocab, trunk_len).tolist()
    tail = rng.integers(100, vocab, forced).tolist()  # the branch's own tokens, then the forced ones
    path = trunk[:branch_at] + tail

    # the trunk, with checkpoints where the engine takes them
    states = SlotStates(rt, memory, per_slot=64, every=every)
    slot = Slot(index=0, seq_id=TRUNK_SEQ)
    checkpoints: dict[int, StateCheckpoint] = {}
    pos = 0
    for stop in [*stops(trunk_len, 0, every), trunk_len]:
        decode_run(rt, TRUNK_SEQ, trunk[pos:stop], pos, logits=False)
        pos = stop
        ckpt = StateCheckpoint(pos, bytes(rt.state_seq_get(TRUNK_SEQ, partial=True)))
        checkpoints[pos] = ckpt
        states.of(slot).add(ckpt)
    slot.tokens = list(trunk)
    base = max(p for p in checkpoints if p <= branch_at)  # what every source resumes from
    ckpt = checkpoints[base]
    segments = [kv.extract(TRUNK_SEQ, 0, base)]

    # the reference: the branch from nothing
    t0 = time.perf_counter()
    ref = decode_run(rt, REF_SEQ, path, 0, logits=True)
    assert ref is not None
    ref = ref[base:]
    full_s = time.perf_counter() - t0
    rt.seq_rm(REF_SEQ, -1, -1)

    out: dict = {"model": str(model), "architecture": rt.info.architecture, "memory": memory.describe(),
                 "trunk": trunk_len, "branch_at": branch_at, "resumed_from": base, "forced_positions": len(ref),
                 "checkpoint_bytes": ckpt.nbytes, "every": every, "reference_s": round(full_s, 3), "sources": {}}
    target = 2  # a fresh sequence per source (S, H, D); A resumes the trunk's own
    with tempfile.TemporaryDirectory() as tmp:
        encoded = encode_segment("agreement", trunk[:base], segments[0])
        disk_seg = read_segment_file(write_segment_file(Path(tmp), encoded).path, "agreement")
        for source in ("S", "H", "D", "A", "none"):
            seq = TRUNK_SEQ if source in ("A", "none") else target
            t0 = time.perf_counter()
            if source == "none":  # the noise floor: cache off, the whole branch again on another sequence
                rt.seq_rm(seq, -1, -1)
                base_none = decode_run(rt, seq, path[:base], 0, logits=False)
                assert base_none is None
            elif source == "A":
                if not states.resume(slot, base, ckpt if not memory.can_cut(rt, TRUNK_SEQ, base, trunk_len) else None):
                    raise RuntimeError("the trunk could not be resumed")
            elif source == "S":
                rt.seq_cp(TRUNK_SEQ, seq, 0, base)
                if not rt.state_seq_set(ckpt.blob, seq, partial=True):
                    raise RuntimeError("the checkpoint was refused")
            else:
                kv.restore(segments if source == "H" else [disk_seg], seq, ckpt)
            restore_s = time.perf_counter() - t0
            got = decode_run(rt, seq, path[base:], base, logits=True)
            assert got is not None
            same = int(np.sum(got.argmax(axis=1) == ref.argmax(axis=1)))
            out["sources"][source] = {"top1_agreement": round(same / len(ref), 4), "positions": len(ref),
                                      "max_abs_logit_diff": float(np.max(np.abs(got - ref))),
                                      "restore_ms": round(restore_s * 1000, 2)}
            if seq != TRUNK_SEQ:
                rt.seq_rm(seq, -1, -1)
    rt.close()
    return out


HEADING = "## State checkpoints: cache on against cache off on sliding-window and hybrid models"


def report_section(res: Path) -> list[str]:
    """docs/benchmarks.md's table of bench/results/checkpoint_agreement/index.json (bench/report.py)."""
    path = res / "checkpoint_agreement" / "index.json"
    out = [HEADING, ""]
    if not path.exists():
        return out + ["Not measured in this revision.", ""]
    data = json.loads(path.read_text())
    out += [f"Command: `{data['command']}`. Each source's prefix resumed with a state checkpoint, then the branch's "
            "tokens teacher-forced; every position's top-1 against the same tokens computed from nothing on another "
            "sequence. `none` recomputes them without a cache on the trunk's sequence: the noise floor of cell "
            "placement alone.", "",
            "| model | resumed from / branch at | checkpoint bytes | source | top-1 agreement | max \\|Δlogit\\| "
            "| restore ms |", "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        for src, v in r["sources"].items():
            out.append(f"| {Path(r['model']).name} ({r['memory']}) | {r['resumed_from']} / {r['branch_at']} | "
                       f"{r['checkpoint_bytes']:,} | {src} | {v['top1_agreement']:.4f} ({v['positions']}) | "
                       f"{v['max_abs_logit_diff']:.2g} | {v['restore_ms']} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, action="append", required=True, help="GGUF (repeat for several)")
    p.add_argument("--trunk", type=int, default=1500)
    p.add_argument("--branch", type=int, default=1100, help="where the branch leaves the trunk")
    p.add_argument("--forced", type=int, default=256, help="branch tokens fed after the resumed prefix")
    p.add_argument("--every", type=int, default=512, help="tokens between checkpoints (--checkpoint-every)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/checkpoint_agreement"))
    a = p.parse_args(argv)
    results = [run(m, a.trunk, a.branch, a.forced, a.every, a.threads) for m in a.model]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "index.json").write_text(json.dumps({"command": "python -m bench.checkpoint_agreement " +
                                                  " ".join(sys.argv[1:] if argv is None else argv),
                                                  "results": results}, indent=1))
    for r in results:
        print(f"{r['architecture']}: resumed from {r['resumed_from']} ({r['checkpoint_bytes']} B checkpoint)")
        for src, v in r["sources"].items():
            print(f"  {src}: top-1 {v['top1_agreement']:.4f} over {v['positions']}, max |dlogit| "
                  f"{v['max_abs_logit_diff']:.2e}, restore {v['restore_ms']} ms")
    print(f"wrote {a.out / 'index.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
