"""What the routes share: settings, metrics, and the model once it has loaded."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from server.api.http.errors import APIError
from server.api.http.metrics import ServerMetrics
from server.api.http.response_store import ResponseStore
from server.bootstrap import LoadedModel
from server.settings import ServerSettings


@dataclass
class ServerState:
    settings: ServerSettings
    model_name: str
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    loaded: LoadedModel | None = None
    load_error: str | None = None
    started_at: float = field(default_factory=time.time)
    responses: ResponseStore = field(init=False)  # stored Responses-API responses (previous_response_id)

    def __post_init__(self) -> None:
        self.responses = ResponseStore(self.settings.responses_store, self.settings.responses_store_mb * 1024 * 1024)

    def require_model(self) -> LoadedModel:
        if self.loaded is not None:
            return self.loaded
        if self.load_error:
            raise APIError(f"the model failed to load: {self.load_error}", status=500, type="server_error")
        raise APIError("the model is still loading", status=503, type="unavailable_error",
                       code="model_loading", headers={"Retry-After": "5"})
