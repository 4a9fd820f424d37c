"""Tools of the financial_research scenario: reports of fictional companies, ratios, growth.

Every number comes from the scenario's dataset, which the scenario hands in
(`financial_tools(load_dataset)`: tools never import scenarios); arithmetic is done here or
by the safe evaluator, never by eval. Amounts are USD millions, as in the reports;
percentages are rounded to two decimals. Unknown companies, quarters or metrics raise
`ToolError` naming what exists, so the model can correct itself.

The dataset is duck-typed: ``meta``, ``companies``, ``statements``, ``notes``, ``quarters``,
``company(name)``, ``quarter(text)``, ``metric(ticker, quarter, name)`` and
``report(ticker, quarter, statement)`` (lookups raise `LookupError` naming what exists).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools.base import Tool, ToolContext, ToolError, object_schema, with_data
from tools.safe_math import UnsafeExpression, evaluate
from tools.text_search import rank

# Formats (ticker or name, quarters like 2024Q3) are stated once in the system prompt rather
# than in every schema: tool schemas are sent with every request.
_COMPANY = {"type": "string"}
_QUARTER = {"type": "string"}


def _resolve(data: Any, company: str, *quarters: str) -> tuple[dict, list[str]]:
    try:
        return data.company(company), [data.quarter(q) for q in quarters]
    except LookupError as problem:
        raise ToolError(str(problem.args[0])) from None


def _metric(data: Any, ticker: str, quarter: str, metric: str) -> float:
    try:
        return data.metric(ticker, quarter, metric)
    except LookupError as problem:
        raise ToolError(str(problem.args[0])) from None


def _pct(new: float, old: float) -> float | None:
    """Percent change; None when the base is zero (undefined)."""
    if old == 0:
        return None
    return round((new - old) / abs(old) * 100, 2)


def list_companies(data: Any, ctx: ToolContext) -> dict:
    quarters = data.quarters
    return {
        "unit": f"{data.meta['currency']} {data.meta['unit']}",
        "quarters": f"{quarters[0]}..{quarters[-1]}",
        "companies": [
            {"ticker": c["ticker"], "name": c["name"], "sector": c["sector"], "segments": c["segments"]}
            for c in data.companies
        ],
    }


def get_report(data: Any, ctx: ToolContext, company: str, quarter: str, statement: str) -> dict:
    found, (q,) = _resolve(data, company, quarter)
    return {"company": found["ticker"], "quarter": q, "statement": statement,
            "items": data.report(found["ticker"], q, statement)}


def get_metric(data: Any, ctx: ToolContext, company: str, metric: str, quarter: str | None = None) -> dict:
    if quarter is not None:
        found, (q,) = _resolve(data, company, quarter)
        return {"company": found["ticker"], "metric": metric, "quarter": q,
                "value": _metric(data, found["ticker"], q, metric)}
    found, _ = _resolve(data, company)
    values = {q: _metric(data, found["ticker"], q, metric) for q in data.quarters}
    return {"company": found["ticker"], "metric": metric, "values": values}


def compare_periods(data: Any, ctx: ToolContext, company: str, quarter_a: str, quarter_b: str,
                    statement: str = "income") -> dict:
    found, (a, b) = _resolve(data, company, quarter_a, quarter_b)
    first = data.report(found["ticker"], a, statement)
    second = data.report(found["ticker"], b, statement)
    return {
        "company": found["ticker"], "from": a, "to": b, "columns": ["from", "to", "change_pct"],
        "items": {name: [first[name], second[name], _pct(second[name], first[name])] for name in first},
    }


def growth(data: Any, ctx: ToolContext, company: str, metric: str, from_quarter: str, to_quarter: str) -> dict:
    found, (a, b) = _resolve(data, company, from_quarter, to_quarter)
    start, end = _metric(data, found["ticker"], a, metric), _metric(data, found["ticker"], b, metric)
    quarters = data.quarters
    steps = quarters.index(b) - quarters.index(a)
    result = {"company": found["ticker"], "metric": metric, "from": a, "to": b,
              "from_value": start, "to_value": end, "change": round(end - start, 2),
              "change_pct": _pct(end, start), "quarters_apart": steps}
    if steps > 0 and start > 0 and end > 0:
        result["avg_quarterly_growth_pct"] = round(((end / start) ** (1 / steps) - 1) * 100, 2)
    return result


# Named ratios: (formula shown to the model, function of the quarter's line items).
_RATIOS: dict[str, tuple[str, Callable[[dict], tuple[float, float]]]] = {
    "gross_margin": ("gross_profit / revenue", lambda d: (d["gross_profit"], d["revenue"])),
    "operating_margin": ("operating_income / revenue", lambda d: (d["operating_income"], d["revenue"])),
    "net_margin": ("net_income / revenue", lambda d: (d["net_income"], d["revenue"])),
    "current_ratio": ("total_current_assets / total_current_liabilities",
                      lambda d: (d["total_current_assets"], d["total_current_liabilities"])),
    "debt_to_equity": ("(short_term_debt + long_term_debt) / shareholders_equity",
                       lambda d: (d["short_term_debt"] + d["long_term_debt"], d["shareholders_equity"])),
    "return_on_equity": ("net_income / shareholders_equity (quarterly)",
                         lambda d: (d["net_income"], d["shareholders_equity"])),
    "free_cash_flow_margin": ("(operating_cash_flow - capex) / revenue",
                              lambda d: (d["operating_cash_flow"] - d["capex"], d["revenue"])),
    "rnd_intensity": ("rnd_expense / revenue", lambda d: (d["rnd_expense"], d["revenue"])),
}
_PERCENT_RATIOS = {"gross_margin", "operating_margin", "net_margin", "return_on_equity",
                   "free_cash_flow_margin", "rnd_intensity"}


def compute_ratio(data: Any, ctx: ToolContext, company: str, quarter: str, ratio: str) -> dict:
    found, (q,) = _resolve(data, company, quarter)
    report = data.statements[found["ticker"]][q]
    items = {**report["income"], **report["balance"], **report["cash_flow"]}
    formula, parts = _RATIOS[ratio]
    numerator, denominator = parts(items)
    if denominator == 0:
        raise ToolError(f"{ratio} is undefined for {found['ticker']} {q}: the denominator is zero")
    value = numerator / denominator
    result = {"company": found["ticker"], "quarter": q, "ratio": ratio, "formula": formula,
              "numerator": round(numerator, 2), "denominator": round(denominator, 2)}
    if ratio in _PERCENT_RATIOS:
        result["value_pct"] = round(value * 100, 2)
    else:
        result["value"] = round(value, 3)
    return result


def calculate(ctx: ToolContext, expression: str) -> dict:
    try:
        value = evaluate(expression)
    except UnsafeExpression as problem:
        raise ToolError(f"cannot calculate: {problem}") from None
    return {"expression": expression, "result": round(value, 6)}


def search_notes(data: Any, ctx: ToolContext, query: str, company: str | None = None, limit: int = 3) -> dict:
    notes = data.notes
    if company is not None:
        found, _ = _resolve(data, company)
        notes = tuple(n for n in notes if n["company"] == found["ticker"])
    names = {c["ticker"]: c["name"] for c in data.companies}
    hits = rank(query, notes,
                lambda n: f"{names[n['company']]} {n['company']} {n['quarter']} {n['topic']} {n['text']}",
                limit)
    return {"query": query, "matches": [dict(note) for _, note in hits]}


def financial_tools(source: Callable[[], Any]) -> tuple[Tool, ...]:
    """The tools, reading the dataset that ``source()`` returns (see the module docstring)."""
    bind = with_data(source)
    return (
        Tool("list_companies", "List the companies, quarters and segments.",
             object_schema({}), bind(list_companies)),
        Tool("get_report", "One statement of a company for a quarter.",
             object_schema({"company": _COMPANY, "quarter": _QUARTER,
                            "statement": {"type": "string", "enum": ["income", "balance", "cash_flow", "segments"]}},
                           ["company", "quarter", "statement"]),
             bind(get_report)),
        Tool("get_metric", "A line item (e.g. revenue, net_income, cash) for one or all quarters.",
             object_schema({"company": _COMPANY, "metric": {"type": "string"}, "quarter": _QUARTER},
                           ["company", "metric"]),
             bind(get_metric)),
        Tool("compare_periods", "Compare a statement between two quarters, item by item.",
             object_schema({"company": _COMPANY, "quarter_a": _QUARTER, "quarter_b": _QUARTER,
                            "statement": {"type": "string", "enum": ["income", "balance", "cash_flow"]}},
                           ["company", "quarter_a", "quarter_b"]),
             bind(compare_periods)),
        Tool("growth", "Growth of a line item between two quarters.",
             object_schema({"company": _COMPANY, "metric": {"type": "string"},
                            "from_quarter": _QUARTER, "to_quarter": _QUARTER},
                           ["company", "metric", "from_quarter", "to_quarter"]),
             bind(growth)),
        Tool("compute_ratio", "A financial ratio for a company and quarter.",
             object_schema({"company": _COMPANY, "quarter": _QUARTER,
                            "ratio": {"type": "string", "enum": list(_RATIOS)}},
                           ["company", "quarter", "ratio"]),
             bind(compute_ratio)),
        Tool("calculate", "Arithmetic on numbers: + - * / ** and parentheses.",
             object_schema({"expression": {"type": "string", "maxLength": 200}}, ["expression"]),
             calculate),
        Tool("search_notes", "Search report notes (segments, events) by keywords.",
             object_schema({"query": {"type": "string"}, "company": _COMPANY,
                            "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
                           ["query"]),
             bind(search_notes)),
    )
