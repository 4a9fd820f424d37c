""".env.example documents exactly the settings the compose files read, with the same defaults."""

from __future__ import annotations

from collections import defaultdict

from tests.deploy.deploy_files import (
    ENV_EXAMPLE,
    REQUIRED_SAMPLES,
    VARIANTS,
    compose_text,
    compose_variables,
    env_example,
)

FILES = sorted({name for files in VARIANTS.values() for name in files})
# Read by docker compose itself, not interpolated in the files.
COMPOSE_OWN = {"COMPOSE_FILE", "COMPOSE_PROJECT_NAME"}


def interpolations() -> dict[str, set[tuple[str | None, str | None]]]:
    found: dict[str, set] = defaultdict(set)
    for name in FILES:
        for var, op, operand in compose_variables(compose_text(name)):
            found[var].add((op, operand))
    return found


def test_every_setting_used_is_documented_and_every_documented_one_is_used():
    used = set(interpolations())
    documented = set(env_example())
    assert used - documented == set(), "read by compose files but missing from .env.example"
    assert documented - used - COMPOSE_OWN == set(), "in .env.example but read by no compose file"


def test_every_documented_setting_has_an_explanation():
    """Each setting sits in a block (no blank line between) that starts with a comment."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            j = i - 1
            while j >= 0 and lines[j] and not lines[j].startswith("#"):
                j -= 1
            assert j >= 0 and lines[j].startswith("#"), f"{line!r} has no comment above it"


def test_defaults_agree_with_the_example():
    """A compose default that differs from .env.example would make the docs lie."""
    example = env_example()
    for var, forms in interpolations().items():
        for op, operand in forms:
            if op == ":-" and example[var] != "":
                assert operand == example[var], f"{var}: compose default {operand!r}, .env.example {example[var]!r}"


def test_required_settings_are_empty_in_the_example():
    """A value in the example (ASCEND_DEVICE_GID=1000 was one) would silence compose's check:
    every `${X:?...}` setting is present but empty, so compose names it until the user sets it."""
    required = {var for var, forms in interpolations().items() for op, _ in forms if op == ":?"}
    assert required == {"MODEL_DIR", "MODEL_FILE", "ASCEND_DEVICE_GID", "NPU_DEVICE_2"} == set(REQUIRED_SAMPLES)
    example = env_example()
    for var in required:
        assert example[var] == "", f".env.example sets required {var}={example[var]!r}: leave it empty"


def test_required_settings_fail_with_a_message():
    for var, forms in interpolations().items():
        for op, operand in forms:
            if op == ":?":
                assert var in operand and ".env" in operand, f"{var}: the error should say what to set"
