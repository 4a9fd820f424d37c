"""Typed workbench settings, read from the environment (and an optional `.env` file).

Environment names: LLM_BASE_URL, LLM_MODEL, LLM_API_KEY, LLM_TIMEOUT_S, LLM_MAX_TOKENS,
LLM_TEMPERATURE, LLM_CONTEXT_TOKENS, INCIDENT_BASE_URL, INCIDENT_TIMEOUT_S, ARBOR_DATA_DIR, DATABASE_URL,
ARBOR_HOST, ARBOR_PORT, ARBOR_WORKBENCH_TOKEN, ARBOR_ALLOWED_HOSTS, ARBOR_IDENTITY_HEADER,
ARBOR_SESSION_HOURS, ARBOR_STEP_BUDGET, ARBOR_TOOL_RESULT_MAX_CHARS,
ARBOR_TOOL_RESULT_MAX_TOKENS, ARBOR_COMPACT_TOOL_SCHEMAS, ARBOR_MAX_MESSAGE_CHARS, ARBOR_RETAIN_TRACES_DAYS,
ARBOR_RETAIN_TURN_EVENTS_DAYS, ARBOR_RETAIN_CHECKPOINTS_DAYS, ARBOR_PRUNE_INTERVAL_S.

Bad values fail at start-up with pydantic's readable validation message, never later.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.db.urls import is_postgres, sqlite_path


def _check_http_url(value: str, name: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{name} must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


class WorkbenchSettings(BaseSettings):
    """Everything the workbench reads from its environment."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    # -- the OpenAI-compatible model backend (arbor-server, llama-server, vLLM, SGLang) ---------
    llm_base_url: str = Field("http://127.0.0.1:8080/v1", validation_alias="LLM_BASE_URL")
    llm_model: str = Field("", validation_alias="LLM_MODEL",
                           description="model id sent in requests; empty = the first id of GET /models")
    llm_api_key: str = Field("not-needed", validation_alias="LLM_API_KEY", repr=False)
    llm_timeout_s: float = Field(120.0, gt=0, le=3600, validation_alias="LLM_TIMEOUT_S")
    llm_max_tokens: int = Field(512, ge=1, le=32768, validation_alias="LLM_MAX_TOKENS",
                                description="max_tokens of each model step")
    llm_temperature: float | None = Field(None, ge=0, le=2, validation_alias="LLM_TEMPERATURE")
    llm_context_tokens: int | None = Field(
        None, ge=256, le=10_000_000, validation_alias="LLM_CONTEXT_TOKENS",
        description="tokens one request may hold (prompt + completion) when the server reports no limit "
                    "(GET /props, GET /v1/models); unset = no context budget unless the server reports one")

    # -- tools ---------------------------------------------------------------------------------
    incident_base_url: str = Field("http://127.0.0.1:8765", validation_alias="INCIDENT_BASE_URL")
    incident_timeout_s: float = Field(5.0, gt=0, le=120, validation_alias="INCIDENT_TIMEOUT_S")

    # -- storage -------------------------------------------------------------------------------
    data_dir: Path = Field(Path("./var"), validation_alias="ARBOR_DATA_DIR")
    database_url: str = Field("", validation_alias="DATABASE_URL",
                              description="SQLAlchemy URL of the tables and the LangGraph checkpoints: "
                                          "sqlite:///FILE or postgresql://USER:PASSWORD@HOST:PORT/DB; "
                                          "empty = sqlite file arbor.db in the data dir")

    # -- turn event journal (following a turn from any workbench process) -----------------------
    event_flush_s: float = Field(0.2, gt=0, le=5, validation_alias="ARBOR_EVENT_FLUSH_S",
                                 description="seconds a turn's events gather before they are written to the database")
    follow_poll_s: float = Field(0.25, gt=0, le=5, validation_alias="ARBOR_FOLLOW_POLL_S",
                                 description="seconds between reads of a turn followed from another process")

    # -- HTTP ----------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", validation_alias="ARBOR_HOST")
    port: int = Field(8090, ge=1, le=65535, validation_alias="ARBOR_PORT")

    # -- who may use it (app/auth/, docs/security.md) ---------------------------------------------
    workbench_token: SecretStr | None = Field(
        None, validation_alias="ARBOR_WORKBENCH_TOKEN",
        description="the operator token (at least 16 characters); unset = the one in <data dir>/workbench-token, "
                    "generated at the first start")
    allowed_hosts: str = Field(
        "", validation_alias="ARBOR_ALLOWED_HOSTS",
        description="comma-separated host names the workbench answers to, besides localhost, 127.0.0.1, ::1 and "
                    "ARBOR_HOST; * = any (only behind a proxy that checks Host itself)")
    identity_header: str = Field(
        "", validation_alias="ARBOR_IDENTITY_HEADER", pattern=r"^[A-Za-z0-9-]*$",
        description="header a trusted reverse proxy sets to the signed-in user (e.g. X-Forwarded-User); unset = "
                    "none is trusted. Set it only when nothing but that proxy can reach the workbench")
    session_hours: float = Field(168.0, gt=0, le=24 * 365, validation_alias="ARBOR_SESSION_HOURS",
                                 description="hours a browser stays signed in")

    # -- agent limits --------------------------------------------------------------------------
    step_budget: int = Field(6, ge=1, le=50, validation_alias="ARBOR_STEP_BUDGET",
                             description="most model calls in one turn")
    tool_result_max_chars: int = Field(4000, ge=200, le=1_000_000, validation_alias="ARBOR_TOOL_RESULT_MAX_CHARS")
    tool_result_max_tokens: int = Field(1000, ge=50, le=250_000, validation_alias="ARBOR_TOOL_RESULT_MAX_TOKENS",
                                        description="estimated at 4 characters per token")
    compact_tool_schemas: bool = Field(
        True, validation_alias="ARBOR_COMPACT_TOOL_SCHEMAS",
        description="send the tools' schemas without what the model does not read (titles, additionalProperties "
                    "false beside properties, runs of whitespace: app/agent/tool_schemas.py); arguments are still "
                    "checked against the full schemas. Off for a template that reads the dropped keywords")
    max_message_chars: int = Field(8000, ge=1, le=1_000_000, validation_alias="ARBOR_MAX_MESSAGE_CHARS")

    # -- retention (app/services/retention.py: `arbor prune` and the workbench's periodic prune) --
    # Days after a turn ended; 0 keeps forever. Nothing of a running or paused turn is pruned.
    retain_traces_days: float = Field(
        30.0, ge=0, le=36500, validation_alias="ARBOR_RETAIN_TRACES_DAYS",
        description="days the request and response bodies of a turn's trace spans are kept (the spans' "
                    "timings, token counts and cache figures stay)")
    retain_turn_events_days: float = Field(
        7.0, ge=0, le=36500, validation_alias="ARBOR_RETAIN_TURN_EVENTS_DAYS",
        description="days a turn's streamed events are kept for replay (its messages and answer stay)")
    retain_checkpoints_days: float = Field(
        30.0, ge=0, le=36500, validation_alias="ARBOR_RETAIN_CHECKPOINTS_DAYS",
        description="days the LangGraph checkpoints inside a turn are kept (forks from inside it); every "
                    "turn's start and end checkpoints and every branch's base stay")
    prune_interval_s: float = Field(
        3600.0, ge=0, le=7 * 86400, validation_alias="ARBOR_PRUNE_INTERVAL_S",
        description="seconds between the running workbench's prunes; 0 = only `arbor prune`")

    @field_validator("llm_base_url")
    @classmethod
    def _llm_url(cls, value: str) -> str:
        return _check_http_url(value, "LLM_BASE_URL")

    @field_validator("incident_base_url")
    @classmethod
    def _incident_url(cls, value: str) -> str:
        return _check_http_url(value, "INCIDENT_BASE_URL")

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        if value and not value.startswith(("sqlite", "postgresql")):
            raise ValueError(f"DATABASE_URL must be a sqlite:// or postgresql:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _default_database(self) -> WorkbenchSettings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.data_dir / 'arbor.db').resolve()}"
        return self

    @property
    def checkpoint_path(self) -> Path | None:
        """The LangGraph checkpointer's SQLite file (graph state of paused and finished runs), or
        None when DATABASE_URL is PostgreSQL, whose checkpoints are tables of that same database.

        With SQLite it is `checkpoints.sqlite` beside the database file (for the default URL: in
        the data dir, where it always was). It is a file of its own so that the checkpointer's
        connection never waits on the workbench's write lock. An in-memory database has no
        directory; its checkpoints go to the data dir.
        """
        if is_postgres(self.database_url):
            return None
        database = sqlite_path(self.database_url)
        return (database.parent if database else self.data_dir) / "checkpoints.sqlite"

    @property
    def trusted_hosts(self) -> list[str]:
        """The host names requests may carry: localhost's, ARBOR_HOST unless it is a wildcard
        bind address, and ARBOR_ALLOWED_HOSTS."""
        hosts = ["localhost", "127.0.0.1", "::1"]
        if self.host not in ("0.0.0.0", "::", ""):
            hosts.append(self.host.strip("[]").lower())
        hosts += [h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()]
        return hosts

    @property
    def session_max_age_s(self) -> int:
        return int(self.session_hours * 3600)

    @property
    def tool_result_budget_chars(self) -> int:
        """The tighter of the two tool-result budgets, in characters."""
        return min(self.tool_result_max_chars, self.tool_result_max_tokens * 4)

    def ensure_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> WorkbenchSettings:
    """The process-wide settings (tests build their own `WorkbenchSettings` instead)."""
    return WorkbenchSettings()
