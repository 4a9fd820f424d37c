"""harness/kernels/paged_kernel_check.py on the CPU backend (ggml's backend API, as on a GPU host): the
quick grid passes and its file says so, a wrong page table or a kernel that reads the mask where it must
not is caught, a device the libraries lack is a clear exit, and the timing mode records paged and dense per size."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")


@pytest.fixture
def cpu_backend():
    from harness.kernels.ggml_backend import Backend
    from harness.kernels.ggml_fa import has_paged_op

    if not has_paged_op():
        pytest.skip("llama-cpp-python was built without Arbor's paged attention patch")
    with Backend("CPU", 2) as backend:
        yield backend


def test_the_quick_grid_passes_on_the_cpu_backend(tmp_path, cpu_backend):
    from harness.kernels import paged_kernel_check

    out = tmp_path / "check.json"
    assert paged_kernel_check.main(["--backend", "CPU", "--quick", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["backend"]["kind"] == "cpu" and got["failed"] == 0
    assert len(got["cases"]) == 32
    assert {(c["rows"], c["gqa"]) for c in got["cases"]} == {(r, g) for r in (1, 8, 64, 124) for g in (1, 4)}
    assert all(c["ok"] and c["poisoned_equal"] and c["paged_err"] < 5e-3 for c in got["cases"])


def layout_and_table(page_size: int, rows: int = 8):
    from harness.kernels import paged_kernel_check
    from harness.kernels.paged_layout import mark_unmasked, ubatch_inputs

    kv, tokens = paged_kernel_check.layout(rows, np.random.default_rng(rows))
    mask, table = ubatch_inputs(kv, tokens, page_size)
    return kv, tokens, mask, table, mark_unmasked(kv, tokens, table, page_size)


@pytest.mark.parametrize(("rows", "row"), [(8, 1), (124, 1), (124, 123)])
def test_a_page_missing_from_the_table_fails_the_case(cpu_backend, rows, row):
    """Decode rows (8: row 1, seq 1, the shared prefix) and a prefill (124: a decode row beside the chunk, and the
    chunk): a sequence whose rows lose their last page reads less than its mask allows. (Rows of one tag list
    prefixes of one list by contract, so every row of the row's sequence loses its last page.)"""
    from harness.kernels.paged_kernel_check import Case, run_case

    case = Case(64, 16, rows, 4)
    kv, tokens, mask, _, marked = layout_and_table(16, rows)
    assert run_case(case, cpu_backend, kv, tokens, mask, marked, np.random.default_rng(1)).ok
    dropped = marked.copy()
    dropped[marked[:, 1] == marked[row, 1], 0] -= 1
    got = run_case(case, cpu_backend, kv, tokens, mask, dropped, np.random.default_rng(1))
    assert not got.ok and got.paged_err > 5e-3


def test_a_prefill_is_poisoned_outside_every_rows_pages_only():
    """Above 64 rows the poisoned mask keeps every page some row lists, marks included (CUDA's gather reads a group
    of rows' pages together); decode rows keep only their own unmarked pages."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_INDEX
    from harness.kernels.paged_kernel_check import poison

    for rows in (64, 124):
        kv, tokens, mask, table, marked = layout_and_table(16, rows)
        got = poison(mask, marked, 16)
        listed = {int(p) & GGML_FA_PAGE_INDEX for r in marked for p in r[2:2 + r[0]]}
        cells = np.zeros(kv.n_kv, dtype=bool)
        for p in listed:
            cells[p * 16:(p + 1) * 16] = True
        if rows == 124:
            assert np.isnan(got[:, ~cells]).all() and not np.isnan(got[:, cells]).any()
        else:
            assert np.isnan(got[:, cells]).any()  # another row's pages, and marked ones


@pytest.mark.parametrize("rows", [1, 8, 64, 124])
def test_the_layouts_carry_pages_cut_short(rows):
    """Exact page lengths: each row count's layout has pages marked with a cut (a sequence's cells filling a page from
    its start), so the check crosses the kernels' stop at the cut; a cut page's cells after the cut are -inf in the
    mask."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_INDEX, GGML_FA_PAGE_UNMASKED, page_cut

    _, _, mask, _, marked = layout_and_table(16, rows)
    cut = [(i, int(p)) for i, r in enumerate(marked) for p in r[2:2 + r[0]] if page_cut(p)]
    assert cut and all(p & GGML_FA_PAGE_UNMASKED for _, p in cut)
    for i, p in cut:
        end = ((p & GGML_FA_PAGE_INDEX) + 1) * 16
        assert (mask[i, end - page_cut(p):end] == -np.inf).all() and (mask[i, end - 16:end - page_cut(p)] == 0).all()


@pytest.mark.parametrize("page_size", [7, 16, 64])
def test_the_prefill_layouts_chunk_is_a_causal_tail(page_size):
    """Causal tails: the 124-row layout's chunk lies in pages of its own, so each of its rows lists its sequence's pages
    only up to its own cell, cut there: lists of one tag that are prefixes of the longest one, equal but for the last
    entry's cut, and a row's cells up to that cut are exactly those its mask keeps from the chunk's first page on."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_INDEX, GGML_FA_PAGE_UNMASKED, page_cut
    from harness.kernels.paged_kernel_check import CHUNK_AT

    _, tokens, mask, _, marked = layout_and_table(page_size, 124)
    chunk = [i for i, (s, _) in enumerate(tokens) if s == 4]
    longest = max(chunk, key=lambda i: marked[i, 0])
    assert len({int(marked[i, 0]) for i in chunk}) > 1
    for i in chunk:
        n = int(marked[i, 0])
        assert (marked[i, 2:1 + n] == marked[longest, 2:1 + n]).all()
        last = int(marked[i, 1 + n])
        assert last & GGML_FA_PAGE_INDEX == marked[longest, 1 + n] & GGML_FA_PAGE_INDEX
        assert last & GGML_FA_PAGE_UNMASKED
        end = ((last & GGML_FA_PAGE_INDEX) + 1) * page_size - page_cut(last)
        assert (mask[i, CHUNK_AT:end] == 0).all() and (mask[i, end:] == -np.inf).all()


def test_a_page_marked_where_the_mask_matters_fails_the_case(cpu_backend):
    """Marking a page that holds other sequences' cells tells the kernel to skip a mask it needs: the poisoned run
    (NaN where a marked page's mask would be) no longer equals the paged one, or the result is wrong."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_UNMASKED
    from harness.kernels.paged_kernel_check import Case, run_case

    case = Case(64, 16, 8, 1)
    kv, tokens, mask, table, marked = layout_and_table(16)
    row = 2  # seq 2: 20 of its cells were placed among other sequences' after evictions
    unmarked = [j for j in range(table[row, 0]) if not marked[row, 2 + j] & GGML_FA_PAGE_UNMASKED]
    assert unmarked
    wrong = marked.copy()
    for j in unmarked:
        wrong[row, 2 + j] |= GGML_FA_PAGE_UNMASKED
    got = run_case(case, cpu_backend, kv, tokens, mask, wrong, np.random.default_rng(2))
    assert not got.ok


def test_a_device_the_libraries_lack_is_a_clear_exit(tmp_path, capsys):
    from harness.kernels import paged_kernel_check

    assert paged_kernel_check.main(["--backend", "NoSuchDevice0", "--out", str(tmp_path / "x.json")]) == 2
    assert "no ggml device 'NoSuchDevice0'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_the_timing_mode_records_paged_and_dense(tmp_path, cpu_backend):
    from harness.kernels import paged_kernel_check

    out = tmp_path / "time.json"
    assert paged_kernel_check.main(["--backend", "CPU", "--no-check", "--time", "--cells", "512",
                                    "--page-sizes", "16", "--iters", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert "cases" not in got
    assert [(t["cells"], t["page_size"], t["seqs"], t["rows"]) for t in got["timings"]] == [
        (512, 16, 8, 8), (512, 16, 1, 1), (512, 16, 8, 64), (512, 16, 1, 512)]
    assert all(t["paged_ms"] > 0 and t["dense_ms"] > 0 for t in got["timings"])


def test_the_report_section_says_what_passed_and_what_it_timed(tmp_path, cpu_backend):
    from harness.kernels import paged_kernel_check

    assert "Not measured in this revision." in paged_kernel_check.report_section(tmp_path)
    assert paged_kernel_check.main(["--backend", "CPU", "--quick", "--time", "--cells", "512", "--page-sizes", "16",
                                    "--iters", "1", "--out", str(tmp_path / "paged_kernel_check.json")]) == 0
    text = "\n".join(paged_kernel_check.report_section(tmp_path))
    assert text.startswith(paged_kernel_check.HEADING)
    assert "`python -m bench.paged_kernel_check --backend CPU --quick --time --cells 512" in text
    assert "--out" not in text
    assert "**32 of 32 cases passed**" in text
    assert text.count("\n| 512 | 16 |") == 4
    assert "\n| 512 | 16 | 8 | 64 |" in text and "\n| 512 | 16 | 1 | 512 |" in text
