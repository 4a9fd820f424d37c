"""Prompt-token estimates without a tokenizer: characters per token, calibrated by the server.

Used where the server cannot count a prompt for the workbench (app/agent/token_count.py):
the workbench then measures a request by the characters of its JSON (messages, plus the tool
schemas when the prompt carries them) and converts with a ratio learned from the server's
own count: after every answered call, ``usage.prompt_tokens`` of that request sets the ratio.
The ratios belong to one branch (they travel in its thread's state, app/agent/context_state.py):
an English session and a Chinese story never share one. A margin on top keeps the estimate on the
safe side; when the server still rejects a request
as too long, `tighten` learns from the rejection (its token count when the message names
one) before the retry.

Requests with and without tools in the prompt are calibrated apart: templates render tool
schemas much denser or looser than prose, and a server may leave them out of the prompt
when ``tool_choice`` is ``"none"`` (`prompt_tools`; arbor-server and vLLM render them anyway),
so one ratio would swing between the two kinds by more than the margin. Until a kind has been
counted its ratio is a conservative
3 characters per token (English and JSON run at 3.5-4.5 on common tokenizers).
"""

from __future__ import annotations

import json
import math
import re

DEFAULT_CHARS_PER_TOKEN = 3.0
MARGIN = 0.10  # estimates are raised by this share
# "the prompt has 1762 tokens" (arbor-server), "(4000 in the messages, ...)" (vLLM)
_PROMPT_COUNT = re.compile(r"prompt has (\d+) tokens|(\d+) (?:tokens )?in the messages")


def prompt_tools(tools: list[dict] | None, tool_choice: object) -> list[dict] | None:
    """The tools a request's prompt may carry: none when tool_choice is "none" (some servers drop
    them then; one that renders them anyway, as arbor-server does, only makes the estimate of
    that kind learn more tokens per character, which errs on the safe side)."""
    if tool_choice == "none" or not tools:
        return None
    return tools


def request_chars(messages: list[dict], tools: list[dict] | None) -> int:
    """The size the estimate works from: the JSON of the messages and the tool schemas."""
    text = json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    if tools:
        text += json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    return len(text)


def prompt_tokens_in_error(message: str) -> int | None:
    """The prompt's token count when a context-length error names it (arbor-server, vLLM)."""
    match = _PROMPT_COUNT.search(message)
    if not match:
        return None
    return int(match.group(1) or match.group(2))


def _kind(tools: list[dict] | None) -> str:
    return "tools" if tools else "plain"


class TokenEstimator:
    """chars -> tokens for the calls of one branch, from its `ratios` ("tools" / "plain" ->
    characters per token; updated in place by `observe` and `tighten`). `tools` arguments are
    the tools the prompt carries (see `prompt_tools`); they also select the ratio."""

    def __init__(self, ratios: dict[str, float] | None = None, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
                 margin: float = MARGIN) -> None:
        self.default = chars_per_token
        self.margin = margin
        self.ratios: dict[str, float] = dict(ratios or {})

    def chars_per_token(self, tools: list[dict] | None) -> float:
        return self.ratios.get(_kind(tools), self.default)

    def tokens(self, messages: list[dict], tools: list[dict] | None) -> int:
        """Estimated prompt tokens of a request, margin included (never below the truth by design)."""
        return math.ceil(request_chars(messages, tools) / self.chars_per_token(tools) * (1 + self.margin))

    def observe(self, messages: list[dict], tools: list[dict] | None, prompt_tokens: int | None) -> None:
        """Learn the ratio from a request the server counted."""
        if prompt_tokens and prompt_tokens > 0:
            self.ratios[_kind(tools)] = max(0.5, request_chars(messages, tools) / prompt_tokens)

    def tighten(self, messages: list[dict], tools: list[dict] | None, error_message: str) -> None:
        """The server refused the request as too long: estimate at least 25% more from now on,
        and more when the error names a count that the estimate fell short of."""
        harder = self.chars_per_token(tools) / 1.25
        counted = prompt_tokens_in_error(error_message)
        if counted:
            harder = min(harder, request_chars(messages, tools) / counted)
        self.ratios[_kind(tools)] = max(0.5, harder)
