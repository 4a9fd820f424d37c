"""ServerSettings: cache flags that only make sense together."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.cli import settings_from_args


def test_cache_dir_with_default_tiers_turns_the_disk_tier_on(tmp_path: Path):
    s = settings_from_args(["--cache-dir", str(tmp_path)])
    assert s.cache_tiers == ("A", "S", "H", "D") and s.tier_enabled("D")


def test_cache_dir_with_tiers_that_leave_out_d_is_refused(tmp_path: Path):
    with pytest.raises(ValidationError, match="leaves out D"):
        settings_from_args(["--cache-tiers", "A,S,H", "--cache-dir", str(tmp_path)])


def test_tier_d_without_a_directory_is_refused():
    with pytest.raises(ValidationError, match="needs --cache-dir"):
        settings_from_args(["--cache-tiers", "A,D"])


def test_the_idle_cell_limit_needs_a_tier_to_write_back_to():
    assert settings_from_args(["--cache-idle-cells", "512"]).cache_idle_cells == 512
    with pytest.raises(ValidationError, match="needs tier H or D"):
        settings_from_args(["--cache-tiers", "A,S", "--cache-idle-cells", "0"])
    with pytest.raises(ValidationError, match="needs tier H or D"):
        settings_from_args(["--no-cache", "--cache-idle-cells", "1024"])


SECRET = ["--cache-shared-secret", "0123456789abcdef0123"]


def test_the_shared_tier_needs_the_host_tier_and_a_redis_url():
    s = settings_from_args(["--cache-shared", "redis://127.0.0.1:6379/0", "--cache-shared-chunk", "128", *SECRET])
    assert (s.cache_shared, s.cache_shared_chunk, s.cache_shared_max_value_mb) == ("redis://127.0.0.1:6379/0", 128, 64)
    with pytest.raises(ValidationError, match="needs tier H"):
        settings_from_args(["--cache-tiers", "A,S", "--cache-shared", "redis://127.0.0.1:6379/0", *SECRET])
    with pytest.raises(ValidationError, match="expected a redis://"):
        settings_from_args(["--cache-shared", "127.0.0.1:6379", *SECRET])
    with pytest.raises(ValidationError, match="expected a redis://") as err:
        settings_from_args(["--cache-shared", "http://:pw-in-url@valkey:6379", *SECRET])
    assert "pw-in-url" not in str(err.value.errors()[0]["msg"])


def test_a_replica_with_a_store_and_no_secret_refuses_to_start(capsys, monkeypatch, tmp_path: Path):
    from server.cli import main

    monkeypatch.delenv("ARBOR_SERVER_CACHE_SHARED_SECRET", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["--cache-shared", "redis://:pw@127.0.0.1:6379/0"])  # exits before any model loads
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--cache-shared needs the deployment's secret" in err and "pw@" not in err
    with pytest.raises(ValidationError, match="at least 16 bytes"):
        settings_from_args(["--cache-shared", "redis://127.0.0.1:6379/0", "--cache-shared-secret", "short"])
    # from a file (a docker secret), from the environment; never both flags
    (tmp_path / "secret").write_text("  from-a-file-0123456789\n")
    s = settings_from_args(["--cache-shared", "redis://127.0.0.1:6379/0", "--cache-shared-secret-file",
                            str(tmp_path / "secret")])
    assert s.cache_shared_secret.get_secret_value() == "from-a-file-0123456789"
    assert "from-a-file" not in repr(s) and "redis://" not in repr(s)  # neither the secret nor the URL shows
    with pytest.raises(ValidationError, match="not both"):
        settings_from_args(["--cache-shared", "redis://127.0.0.1:6379/0", *SECRET, "--cache-shared-secret-file",
                            str(tmp_path / "secret")])
    monkeypatch.setenv("ARBOR_SERVER_CACHE_SHARED_SECRET", "from-the-environment-0123")
    s = settings_from_args(["--cache-shared", "redis://127.0.0.1:6379/0"])
    assert s.cache_shared_secret.get_secret_value() == "from-the-environment-0123"


def test_paged_attention_flags():
    s = settings_from_args([])
    assert (s.paged_attn, s.page_size) == ("auto", 16)
    assert settings_from_args(["--paged-attn"]).paged_attn == "on"  # bare flag: required
    assert settings_from_args(["--paged-attn", "off", "--page-size", "64"]).page_size == 64
    assert s.page_placement == "owned"
    assert settings_from_args(["--page-placement", "shared"]).page_placement == "shared"
    with pytest.raises(SystemExit):  # argparse's choices
        settings_from_args(["--page-placement", "mine"])
    with pytest.raises(ValidationError, match="needs flash attention"):
        settings_from_args(["--paged-attn", "on", "--flash-attn", "off"])
    with pytest.raises(ValidationError):
        settings_from_args(["--page-size", "0"])


def test_version_says_whether_paged_attention_is_compiled_in(capsys):
    pytest.importorskip("llama_cpp")
    from server.cli import main
    from server.engine import paged_attention

    main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("arbor-server ")
    assert ("paged attention: compiled in" in out) == paged_attention.compiled_in()


def test_kv_events_need_a_tier_the_tree_holds():
    assert settings_from_args(["--kv-events-endpoint", "tcp://*:5557"]).kv_events_block_size == 16
    for flags in (["--cache-tiers", "A"], ["--no-cache"]):
        with pytest.raises(ValidationError, match="kv-events-endpoint publishes the radix tree"):
            settings_from_args(["--kv-events-endpoint", "tcp://*:5557", *flags])


def test_cpu_fallback_flag_needs_layers_asked_of_an_accelerator(monkeypatch):
    assert settings_from_args(["--n-gpu-layers", "99", "--allow-cpu-fallback"]).allow_cpu_fallback
    assert not settings_from_args(["-ngl", "-1"]).allow_cpu_fallback
    with pytest.raises(ValidationError, match="only matters with --n-gpu-layers"):
        settings_from_args(["--allow-cpu-fallback"])
    monkeypatch.setenv("ARBOR_SERVER_ALLOW_CPU_FALLBACK", "true")
    monkeypatch.setenv("ARBOR_SERVER_N_GPU_LAYERS", "999")
    assert settings_from_args([]).allow_cpu_fallback  # how the compose overlays set it
    monkeypatch.setenv("ARBOR_SERVER_ALLOW_CPU_FALLBACK", "maybe")
    with pytest.raises(ValidationError):
        settings_from_args([])


def test_version_lists_the_backends_and_devices_llama_cpp_sees(capsys):
    pytest.importorskip("llama_cpp")
    from server.cli import main
    from server.engine.backend_devices import inventory

    main(["--version"])
    out = capsys.readouterr().out
    for line in inventory().lines():
        assert line.split(",")[0] in out
    assert "backends: " in out and "CPU (1 device)" in out


# The flags are generated from ServerSettings (server/cli.py): one per field, help and default from the field.

def _actions():
    from server.cli import build_parser

    return {a.dest: a for a in build_parser()._actions}


def test_every_setting_is_a_flag_whose_help_states_the_fields_default_once():
    from server.settings import ServerSettings

    actions = _actions()
    for name, field in ServerSettings.model_fields.items():
        action = actions[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.default is None  # not given: the environment or the field's default applies
        assert field.description and action.help.startswith(field.description.replace("%", "%%"))
        assert "(default " not in field.description, f"{name}: the help adds the default from the field"
        default = field.default if field.default_factory is None else None  # a factory: the description says
        if default not in (None, False, (), ""):
            shown = ",".join(default) if isinstance(default, tuple) else f"{default:g}" \
                if isinstance(default, float) else str(default)
            assert action.help.endswith(f"(default {shown})") and action.help.count("(default") == 1, name


def test_llama_server_short_flags_and_the_sections_of_help():
    from server.cli import build_parser

    actions = _actions()
    for name, short in (("model", "-m"), ("parallel", "-np"), ("ctx_size", "-c"), ("batch_size", "-b"),
                        ("threads", "-t"), ("threads_batch", "-tb"), ("n_gpu_layers", "-ngl")):
        assert actions[name].option_strings == ["--" + name.replace("_", "-"), short]
    s = settings_from_args(["-m", __file__, "-np", "2", "-c", "1024", "-b", "64", "-t", "1", "-ngl", "0"])
    assert (s.model, s.parallel, s.ctx_size, s.batch_size, s.threads, s.n_gpu_layers) == (
        Path(__file__), 2, 1024, 64, 1, 0)
    assert s.batch_threads == 1  # without -tb, steps of several tokens take --threads too (as llama.cpp)
    assert settings_from_args(["-m", __file__, "-t", "1", "-tb", "2"]).batch_threads == 2
    text = build_parser().format_help()
    for section in ("prefix cache:", "shared store:", "KV events:", "request limits:"):
        assert "\n" + section in text
    assert "--cache-ram CACHE_RAM\n" in text.split("prefix cache:")[1].split("shared store:")[0]
    assert "--ctx-size CTX_SIZE, -c CTX_SIZE" in text and "(default 8192)" in text


def test_flags_of_every_kind_reach_their_fields(tmp_path: Path):
    s = settings_from_args([
        "--host", "0.0.0.0", "--cache-session-idle", "2.5", "--cache-dir", str(tmp_path), "--no-cache",
        "--strict-model-name", "--cache-route", "longest", "--cache-tiers", " a, s ,H,D,", "--cors-origins",
        "http://a.example/, https://b.example", "--allowed-hosts", "Server, server-2", "--chat-template-kwargs",
        '{"enable_thinking": false}', "--max-choices", "3", "--kv-events-topic", "kv"])
    assert (s.host, s.cache_session_idle, s.cache_dir, s.no_cache, s.strict_model_name, s.cache_route) == (
        "0.0.0.0", 2.5, tmp_path, True, True, "longest")
    assert s.cache_tiers == ("A", "S", "H", "D")  # lists: comma separated
    assert s.cors_origins == ("http://a.example", "https://b.example")
    assert s.allowed_hosts == ("server", "server-2")
    assert (s.chat_template_kwargs, s.max_choices, s.kv_events_topic) == ({"enable_thinking": False}, 3, "kv")
    with pytest.raises(SystemExit):
        settings_from_args(["--cache-route", "shortest"])  # Literal: argparse's choices
    with pytest.raises(SystemExit):
        settings_from_args(["--chat-template-kwargs", "[1]"])


def test_an_invalid_flag_is_named_in_the_error(capsys):
    from server.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["-c", "16"])
    assert exc.value.code == 2 and "arbor-server: --ctx-size: " in capsys.readouterr().err
