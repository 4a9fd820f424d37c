"""backend_devices against the real llama.cpp library this environment runs."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from server.engine.backend_devices import inventory


def test_every_device_belongs_to_a_registered_backend_and_the_cpu_is_one():
    inv = inventory()
    assert sum(b.n_devices for b in inv.backends) == len(inv.devices)
    assert {d.backend for d in inv.devices} <= {b.name for b in inv.backends}
    cpu = [d for d in inv.devices if d.kind == "cpu"]
    assert len(cpu) == 1 and cpu[0].backend == "CPU" and cpu[0].memory_total > 0
    assert inv.accelerators == tuple(d for d in inv.devices if d.kind in ("gpu", "igpu"))


def test_the_last_line_names_the_accelerators_or_says_there_are_none():
    inv = inventory()
    names = ", ".join(d.name for d in inv.accelerators)
    assert inv.lines()[-1] == f"accelerators: {names}" if names else inv.lines()[-1].startswith("accelerators: none")


def test_a_function_the_library_lacks_is_named():
    from server.engine.llama_backend import MissingSymbol, c_functions

    with pytest.raises(MissingSymbol, match="has no ggml_backend_does_not_exist"):
        c_functions({"ggml_backend_does_not_exist": ([], None)})
