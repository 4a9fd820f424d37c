"""Ask a server about itself (metadata for results) and for its tokenization (for the ideal).

Every call here is best effort: servers differ (llama-server and arbor-server have /props,
/tokenize and /apply-template; vLLM and SGLang have other routes), so failures come back as
values, not exceptions.
"""

from __future__ import annotations

from typing import Any

import httpx

PROBE_TIMEOUT_S = 10.0


async def _get_json(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> Any:
    try:
        response = await client.get(url, headers=headers, timeout=PROBE_TIMEOUT_S)
        if response.status_code != 200:
            return {"unavailable": f"HTTP {response.status_code}"}
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


def _trim_props(props: Any) -> Any:
    # /props carries the whole chat template and default sampling settings; keep what identifies the setup.
    if not isinstance(props, dict):
        return props
    keep = ("model_path", "model_alias", "total_slots", "n_ctx", "build_info", "modalities", "unavailable", "arbor")
    trimmed = {k: props[k] for k in keep if k in props}
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and "n_ctx" in settings:
        trimmed.setdefault("n_ctx", settings["n_ctx"])
    return trimmed


async def server_info(client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> dict[str, Any]:
    """``/v1/models`` and a trimmed ``/props`` (each may say ``unavailable``)."""
    return {"models": await _get_json(client, f"{root}/v1/models", headers),
            "props": _trim_props(await _get_json(client, f"{root}/props", headers))}


def first_model_id(info: dict[str, Any]) -> str | None:
    models = info.get("models")
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return first["id"]
    return None


class ServerTokenizerUnavailable(RuntimeError):
    """The server cannot render or tokenize prompts for us."""


class ServerTokenizer:
    """Prompt tokens as the server sees them: /apply-template then /tokenize (llama-server API).

    Chat bodies are rendered with the server's template (tools included) and tokenized with
    special tokens added and parsed, as llama-server does for chat requests.
    """

    def __init__(self, client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> None:
        self._client, self._root, self._headers = client, root, headers

    async def _post(self, path: str, payload: dict) -> dict:
        try:
            response = await self._client.post(f"{self._root}{path}", json=payload, headers=self._headers,
                                               timeout=PROBE_TIMEOUT_S * 3)
        except httpx.HTTPError as exc:
            raise ServerTokenizerUnavailable(f"{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ServerTokenizerUnavailable(f"{path}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError as exc:
            raise ServerTokenizerUnavailable(f"{path}: answer is not JSON") from exc

    async def tokens(self, body: dict) -> list[int]:
        if "messages" in body:
            payload = {"messages": body["messages"]}
            if body.get("tools"):
                payload["tools"] = body["tools"]
            rendered = await self._post("/apply-template", payload)
            prompt = rendered.get("prompt")
            if not isinstance(prompt, str):
                raise ServerTokenizerUnavailable("/apply-template: no prompt in the answer")
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
            if not isinstance(prompt, str):
                raise ServerTokenizerUnavailable("completions body without a string prompt")
        answer = await self._post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise ServerTokenizerUnavailable("/tokenize: no tokens in the answer")
        # /tokenize may answer {"id", "piece"} objects when asked for pieces; accept both shapes.
        return [t["id"] if isinstance(t, dict) else int(t) for t in tokens]
