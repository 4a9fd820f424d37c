"""Read-only access to the fictional companies' reports shipped in data/.

`load_dataset()` reads the JSON files once (they ship inside the package, found through
`Path(__file__).parent`) and answers lookups with forgiving inputs: a company by ticker or
name in any case, a quarter as "2024Q3", "2024-Q3" or "Q3 2024". Lookups that fail raise
`LookupError` with a message naming what exists; the tools turn it into a `ToolError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
STATEMENTS = ("income", "balance", "cash_flow", "segments")

# "2024q3", "2024 - q3", "q3_2024": spaces, then at most one '-' or '_' with spaces after it. Written
# so that a run of spaces can be split only one way: "\s*[-_ ]?\s*" splits n spaces n² ways, and a
# tool argument of 16K spaces held the GIL (and every stream) for 1.3 s, quadratically more beyond.
_QUARTER_FORMS = (
    re.compile(r"^(?P<year>\d{4})\s*(?:[-_]\s*)?q(?P<q>[1-4])$"),
    re.compile(r"^q(?P<q>[1-4])\s*(?:[-_]\s*)?(?P<year>\d{4})$"),
)


@dataclass(frozen=True)
class FinancialDataset:
    meta: dict
    companies: tuple[dict, ...]
    statements: dict  # ticker -> quarter -> statement -> items
    notes: tuple[dict, ...]

    @property
    def quarters(self) -> list[str]:
        return list(self.meta["quarters"])

    def company(self, name_or_ticker: str) -> dict:
        wanted = name_or_ticker.strip().lower()
        for company in self.companies:
            if wanted in (company["ticker"].lower(), company["name"].lower()):
                return company
        # A unique partial name match ("northwind") is accepted too.
        partial = [c for c in self.companies if wanted and wanted in c["name"].lower()]
        if len(partial) == 1:
            return partial[0]
        known = ", ".join(f"{c['ticker']} ({c['name']})" for c in self.companies)
        raise LookupError(f"unknown company {name_or_ticker!r}; known: {known}")

    def quarter(self, text: str) -> str:
        cleaned = text.strip().lower()
        for form in _QUARTER_FORMS:
            match = form.match(cleaned)
            if match:
                quarter = f"{match['year']}Q{match['q']}"
                if quarter in self.meta["quarters"]:
                    return quarter
                break
        quarters = self.meta["quarters"]
        raise LookupError(f"unknown quarter {text!r}; reports cover {quarters[0]} to {quarters[-1]} "
                          f"(write e.g. {quarters[-1]})")

    def report(self, ticker: str, quarter: str, statement: str):
        return self.statements[ticker][quarter][statement]

    def metric_names(self) -> list[str]:
        """Every line item of the income, balance and cash-flow statements, in statement order."""
        first = next(iter(next(iter(self.statements.values())).values()))
        names: list[str] = []
        for statement in ("income", "balance", "cash_flow"):
            names.extend(n for n in first[statement] if n not in names)
        return names

    def metric(self, ticker: str, quarter: str, name: str) -> float:
        """One line item of the income, balance or cash-flow statement ("net income" works too)."""
        quarter_data = self.statements[ticker][quarter]
        key = name.strip().lower().replace(" ", "_").replace("-", "_")
        for statement in ("income", "balance", "cash_flow"):
            if key in quarter_data[statement]:
                return quarter_data[statement][key]
        raise LookupError(f"unknown metric {name!r}; known: {', '.join(self.metric_names())}")


@cache
def load_dataset() -> FinancialDataset:
    companies = json.loads((DATA_DIR / "companies.json").read_text())
    statements = json.loads((DATA_DIR / "statements.json").read_text())
    notes = json.loads((DATA_DIR / "notes.json").read_text())
    return FinancialDataset(
        meta=companies["meta"],
        companies=tuple(companies["companies"]),
        statements=statements,
        notes=tuple(notes),
    )
