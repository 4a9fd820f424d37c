"""compose.scale.yaml over compose.yaml, rendered by Debian's docker-compose (v1) `config`:
replicas behind the router, the workbenches on PostgreSQL through the router, no host port
or cache directory shared, the shared KV store behind a password on a network only the
replicas reach, its values MACed with a required secret. No Docker engine needed."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.test_compose_cli import COMPOSE, config, env_with

pytestmark = pytest.mark.skipif(COMPOSE is None, reason="docker-compose (v1) is not installed")

FILES = ["compose.yaml", "compose.scale.yaml"]
STORE = {"POSTGRES_PASSWORD": "s3cret", "VALKEY_PASSWORD": "v4lkeypass",
         "ARBOR_CACHE_SHARED_SECRET": "0123456789abcdef01",
         "ARBOR_WORKBENCH_TOKEN": "workbench-token-0123456789"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    done = config(FILES, env_with(tmp_path_factory.mktemp("env"), **STORE))
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.fixture(scope="module")
def services(rendered) -> dict:
    return rendered["services"]


def _flag(command: list[str], name: str) -> list[str]:
    """The values after `name` up to the next flag."""
    i = command.index(name) + 1
    out = []
    while i < len(command) and not command[i].startswith("--"):
        out.append(command[i])
        i += 1
    return out


def test_the_router_fronts_every_replica(services):
    replicas = {n for n, s in services.items() if s.get("command", [None])[0] == "arbor-server"}
    assert replicas == {"server", "server-2"}
    router = services["router"]["command"]
    assert set(_flag(router, "--worker-urls")) == {f"http://{n}:8080" for n in replicas}
    assert _flag(router, "--policy") == ["cache_aware"]
    # every replica serves the same model name (the router routes by it)
    assert len({tuple(_flag(services[n]["command"], "--alias")) for n in replicas}) == 1
    caches = [v for n in replicas for v in services[n]["volumes"] if v.split(":")[1] == "/var/lib/arbor/cache"]
    assert len(caches) == len({c.split(":")[0] for c in caches}) == 2, caches  # no shared disk tier


def test_every_replica_uses_the_one_shared_kv_store(services):
    replicas = [n for n, s in services.items() if s.get("command", [None])[0] == "arbor-server"]
    assert {services[n]["environment"]["ARBOR_SERVER_CACHE_SHARED"] for n in replicas} == {
        "redis://:v4lkeypass@valkey:6379/0"}
    assert {services[n]["environment"]["ARBOR_SERVER_CACHE_SHARED_SECRET"] for n in replicas} == {"0123456789abcdef01"}
    for n in replicas:
        assert services[n]["depends_on"]["valkey"]["condition"] == "service_healthy"
        assert "H" in _flag(services[n]["command"], "--cache-tiers")[0].split(","), "the shared tier needs tier H"
    valkey = services["valkey"]["command"]
    assert _flag(valkey, "--maxmemory-policy") == ["allkeys-lru"] and _flag(valkey, "--maxmemory") == ["4gb"]
    assert "ports" not in services["valkey"]  # only the replicas talk to it


def test_the_workbenches_use_the_router_and_one_postgresql(services):
    for name in ("workbench", "workbench-2"):
        env = services[name]["environment"]
        assert env["LLM_BASE_URL"] == "http://router:8000/v1"
        assert env["DATABASE_URL"] == "postgresql://arbor:s3cret@postgres:5432/arbor"
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["workbench"]["volumes"] != services["workbench-2"]["volumes"]


def test_no_host_port_is_published_twice(services):
    published = [p.rsplit(":", 2)[-2] for s in services.values() for p in s.get("ports", [])]
    assert len(published) == len(set(published)), published


def test_the_database_password_is_required(tmp_path):
    done = config(FILES, env_with(tmp_path, **{k: v for k, v in STORE.items() if k != "POSTGRES_PASSWORD"}))
    assert done.returncode != 0 and "POSTGRES_PASSWORD" in done.stderr, done.stderr


@pytest.mark.parametrize("missing", ["VALKEY_PASSWORD", "ARBOR_CACHE_SHARED_SECRET", "ARBOR_WORKBENCH_TOKEN"])
def test_the_store_password_and_the_shared_secret_are_required(tmp_path, missing):
    done = config(FILES, env_with(tmp_path, **{k: v for k, v in STORE.items() if k != missing}))
    assert done.returncode != 0 and missing in done.stderr, done.stderr


def test_only_the_replicas_reach_the_store_and_it_asks_for_a_password(rendered, services):
    assert rendered["networks"]["kv"]["internal"] is True  # no route out, nothing published
    on_kv = {n for n, s in services.items() if "kv" in (s.get("networks") or {})}
    assert on_kv == {"server", "server-2", "valkey"}  # not the router, the workbenches, postgres, incident-api
    assert set(services["valkey"]["networks"]) == {"kv"}
    for n in ("server", "server-2"):
        assert "default" in services[n]["networks"]  # the router still reaches them
    valkey = services["valkey"]
    script = valkey["entrypoint"][2]
    assert "requirepass $$VALKEY_PASSWORD" in script and "valkey-server -" in script  # config on stdin
    assert "v4lkeypass" not in " ".join(valkey["entrypoint"] + valkey["command"])  # in no process list
    assert "REDISCLI_AUTH" in " ".join(valkey["healthcheck"]["test"])
