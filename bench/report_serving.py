"""docs/benchmarks.md's sections about serving under stress: the soak, the event loop's latency, the tree's
eviction, n choices and hostile requests (bench/report.py assembles them with the others)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report_format import _f, _load


def soak_section(res: Path) -> list[str]:
    r = _load(res / "soak.json")
    out = ["## Soak: mixed traffic for a long time", "",
           "Command: `python -m bench.soak --duration-s 1800` (2 slots, 4 clients, agent sessions with hints and "
           "branches + shared-prefix + unique prompts; 10% of the clients give up, half of them mid-stream, "
           "half before a whole answer comes; tiers A,S,H,D on 16 MiB host / 32 MiB disk / 512 resident cells, "
           "sessions forgotten after 5 idle minutes). Targets: 0 5xx, every tier within its budget at every "
           "sample (the host tier's buffers, the disk tier's files as the file system sees them), KV at rest as "
           "llama.cpp reports it, disk files = index, RSS and session-registry growth < 5% over the second half "
           "(the KV buffer's pages and the host tier fill during the first part of a run; growth over the second "
           "half is what a leak would show), no slot busy once every client has gone.", ""]
    if r is None:
        return out + ["Not measured in this revision.", ""]
    growth = (r["rss_end_mib"] / r["rss_start_mib"] - 1) * 100 if r["rss_start_mib"] else None
    rows = [("duration", f"{_f(r['duration_s'], 0)} s"), ("requests", r["requests"]),
            ("by kind", ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_kind", {}).items()))),
            ("by status", ", ".join(f"{k}: {v}" for k, v in sorted(r["by_status"].items()))),
            ("5xx", r["server_errors"]), ("client errors", r["client_errors"]), ("streams cut", r["streams_cut"]),
            ("TTFT p50 / p99", f"{_f(r['ttft_p50_s'])} s / {_f(r['ttft_p99_s'])} s"),
            ("RSS start → end", f"{_f(r['rss_start_mib'], 0)} → {_f(r['rss_end_mib'], 0)} MiB ({_f(growth, 1)}%)"),
            ("RSS half-way → end (growth after warm-up)",
             f"{_f(r.get('rss_mid_mib'), 0)} → {_f(r['rss_end_mib'], 0)} MiB "
             f"({_f(r.get('rss_growth_second_half_pct'), 1)}%)" if r.get("rss_mid_mib") else "not sampled"),
            ("KV at rest, start", json.dumps(r["kv_start"])), ("KV at rest, end", json.dumps(r["kv_end"])),
            ("KV at rest after POST /cache/flush",
             json.dumps(r["kv_flushed"]) if r.get("kv_flushed") else "not measured"),
            ("disk files / files the index uses / index ranges",
             f"{r['disk_files']} / {r.get('disk_index_files', '–')} / {r['disk_index_entries']}"),
            ("cache fallbacks", _f(r["fallbacks"], 0)), ("server alive at the end", r["server_alive"])]
    if "samples" in r:
        rows[7:7] = [("whole answers abandoned by their client", r["answers_abandoned"]),
                     ("generations the server stopped because the client left", _f(r["requests_abandoned"], 0)),
                     ("slots busy once every client had gone", r["busy_slots_after_clients_left"]),
                     ("samples over a budget", f"{r['budget_violations']} of {len(r['samples'])}")]
        rows.insert(14, ("sessions remembered, half-way → end (growth)",
                         f"{_f(r['registry_mid'], 0)} → {_f(r['registry_end'], 0)} "
                         f"({_f(r['registry_growth_second_half_pct'], 1)}%)"))
    out += ["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    samples = r.get("samples") or []
    if samples:
        step = max(1, len(samples) // 10)
        out += ["Over time (every sample's bytes within budget: host 16 MiB, disk 32 MiB):", "",
                "| t (s) | RSS MiB | sessions | host held MiB | disk files MiB | disk queue MiB | abandoned |",
                "|---|---|---|---|---|---|---|"]
        for smp in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
            out.append(f"| {_f(smp['t'], 0)} | {_f(smp['rss_mib'], 0)} | {_f(smp['sessions'], 0)} | "
                       f"{_f(smp['host_held_bytes'] / 2**20, 1)} | {_f(smp['disk_files_bytes'] / 2**20, 1)} | "
                       f"{_f(smp['disk_queue_bytes'] / 2**20, 1)} | {_f(smp['abandoned'], 0)} |")
        out.append("")
    return out


def loop_latency_section(res: Path) -> list[str]:
    data = _load(res / "loop_latency.json")
    out = ["## /metrics and /health while the cache stores large KV", "",
           "Command: `python -m bench.loop_latency --ref-tree <older checkout>` (2 slots, tiers A,S,H,D, "
           "write-back at once; long prompts that each take a slot holding another long prefix, while a poller "
           "asks GET /metrics and GET /health every 20 ms). Target: both answer within 50 ms while a store runs.",
           ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    out += [f"{data['rounds']} prompts of {data['prompt_words']} words.", "",
            "| server | endpoint | answers | p50 ms | p99 ms | max ms | over 50 ms | KV write-backs |",
            "|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        for ep in ("metrics", "health"):
            m = row[ep]
            out.append(f"| {row['server']} | /{ep} | {m['n']} | {_f(m['p50_ms'])} | {_f(m['p99_ms'])} | "
                       f"{_f(m['max_ms'])} | {m['over_50ms']} | {row['write_backs']} |")
    return out + [""]


def tree_evict_section(res: Path) -> list[str]:
    rows = _load(res / "tree_evict.json")
    out = ["## One budget eviction as the radix tree grows", "",
           "Command: `python -m bench.tree_evict` (no model; each call evicts one value from a tree of "
           "agent-like paths). `first` ranks the tier's bottoms (once per policy); later calls pop from the kept "
           "eviction queue; `scan` is only a walk over every node.", ""]
    if rows is None:
        return out + ["Not measured in this revision.", ""]
    out += ["| values | nodes | first eviction µs | later evictions µs | node walk µs |", "|---|---|---|---|---|"]
    out += [f"| {r['values']} | {r['nodes']} | {_f(r['first_evict_us'], 0)} | {_f(r['evict_us'], 1)} | "
            f"{_f(r['scan_us'], 0)} |" for r in rows]
    return out + [""]


def n_choices_section(res: Path) -> list[str]:
    data = _load(res / "n_choices.json")
    out = ["## n choices from one prompt", "",
           "Command: `python -m bench.n_choices` (one request with `n` choices against `n` separate concurrent "
           "requests with the same prompt, temperature 0.8, `ignore_eos`; modes alternate; medians). Target: "
           "decode tok/s of n=4 at least 0.9x that of 4 separate requests, the prompt computed once.", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    s = data["settings"]
    out += [f"Settings: n={s['n']}, {s['max_tokens']} tokens per choice, a {s['prompt_words']}-word prompt, "
            f"{s['rounds']} rounds, model {s['model'] or 'embedded'}.", "",
            "| mode | decode tok/s | wall s | prompt tokens computed (of the prompt's) |", "|---|---|---|---|"]
    for mode, m in data["median"].items():
        label = f"one request, n={s['n']}" if mode == "n" else f"{s['n']} separate requests"
        out.append(f"| {label} | {_f(m['decode_tok_s'], 1)} | {_f(m['wall_s'])} | "
                   f"{_f(m['computed_prompt_tokens'], 0)} ({_f(m['prompt_tokens'], 0)}) |")
    return out + ["", f"n over separate, decode tok/s: {data['n_over_separate_decode']}.", ""]


HOSTILE = "hostile_requests.json"


def _server_flags(command: str) -> str:
    """arbor-server's flags from a recorded command line, without the interpreter and the port."""
    words = command.split()
    if "server" in words:
        words = words[words.index("server") + 1:]
    if "--port" in words:
        i = words.index("--port")
        del words[i:i + 2]
    return " ".join(words)


def _gap_by_case(data: dict) -> dict[str, float]:
    """The longest watcher gap seen while each case was in flight ('no case' for gaps between cases)."""
    out: dict[str, float] = {}
    for stall in data.get("stalls_over_threshold", []):
        for name in stall["cases_in_flight"] or ["no case in flight"]:
            out[name] = max(out.get(name, 0.0), stall["gap_s"])
    return out


def hostile_section(res: Path) -> list[str]:
    data = _load(res / HOSTILE)
    out = ["## Hostile requests while another request decodes", "",
           "Command: `python -m bench.hostile_requests` (arbor-server on the embedded model with an API key and "
           "/v1/embeddings; hostile bodies, headers, hosts and keys sent one after the other while a watcher "
           "streams 200-token chat completions back to back and times every chunk; then /health and /slots). "
           "A *clear error* is a 4xx with an OpenAI error body, *served sanely* a 2xx with the route's shape. "
           "A gap is the longest wait between two chunks of one watcher stream; the first stream, before any "
           "case is sent, is the undisturbed one. Target: no 5xx, /health answers after, gaps under a second.", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    w = data["watcher"]
    statuses: dict[int, int] = {}
    for case in data["cases"]:
        if case["kind"] == "clear error":
            statuses[case["status"]] = statuses.get(case["status"], 0) + 1
    served = [c for c in data["cases"] if c["kind"] == "served sanely"]
    out += [f"Server: `arbor-server {_server_flags(data['command'])}`.", "",
            "| figure | value |", "|---|---|",
            f"| cases | {data['n_cases']} |",
            f"| clear errors | {data['n_clear_errors']} ("
            + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())) + ") |",
            f"| served sanely | {data['n_served_sanely']} |",
            f"| 5xx | {len(data['five_xx'])} |",
            f"| neither a clear error nor a sane answer | {len(data['neither_clear_nor_sane'])} |",
            f"| not the outcome the case expects | {len(data['unexpected_outcome'])} |",
            f"| /health after | {data['health_after']} |",
            f"| every slot idle after | {'yes' if data['slots_after_idle'] else 'no'} |",
            f"| watcher streams | {w['streams']} of {w['tokens_per_stream']} tokens |",
            f"| longest gap, undisturbed first stream | {_f(w['baseline_max_gap_s'])} s |",
            f"| longest gap while the cases ran | {_f(w['max_gap_s'])} s |", ""]
    if served:
        out += ["Served sanely (case: latency): " + "; ".join(f"{c['name']}: {_f(c['latency_s'], 1)} s" for c in served)
                + ".", ""]
    gaps = sorted(_gap_by_case(data).items(), key=lambda kv: -kv[1])
    if gaps:
        out += [f"Longest gap while each case was in flight (gaps over {data['settings']['stall_s']} s; a gap counts "
                "for every case in flight during it):", "",
                "| case | longest gap s |", "|---|---|", *(f"| {name} | {_f(g)} |" for name, g in gaps[:8]), ""]
    runs = [json.loads(f.read_text()) for f in sorted(res.glob("hostile_*.json")) if f.name != HOSTILE]
    if runs:
        out += ["The same watcher against a few cases under other server flags (`python -m bench.hostile_requests "
                "--only CASES --server-args FLAGS --out FILE`, one run each):", "",
                "| server flags | cases (latency) | undisturbed gap s | longest gap s | longest gap with a case in "
                "flight |", "|---|---|---|---|---|"]
        for d in runs:
            st, w = d["settings"], d["watcher"]
            with_case = [(n, g) for n, g in _gap_by_case(d).items() if n != "no case in flight"]
            worst = max(with_case, key=lambda kv: kv[1], default=None)
            cases = "; ".join(f"{c['name']} ({_f(c['latency_s'], 1)} s)" for c in d["cases"])
            out.append(f"| {st.get('server_args') or 'defaults'} | {cases} | {_f(w['baseline_max_gap_s'])} | "
                       f"{_f(w['max_gap_s'])} | " + (f"{_f(worst[1])} s ({worst[0]})" if worst else "–") + " |")
        out.append("")
    return out
