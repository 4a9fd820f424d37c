"""Wiring of the financial_research scenario: prompt, tools, starter questions, data summary."""

from __future__ import annotations

from scenarios.financial_research.dataset import STATEMENTS, load_dataset
from scenarios.scenario import Scenario, read_prompt
from tools.financial import financial_tools


def _summary() -> dict:
    data = load_dataset()
    return {
        "companies": [{"ticker": c["ticker"], "name": c["name"], "sector": c["sector"]}
                      for c in data.companies],
        "quarters": data.quarters,
        "statements": list(STATEMENTS),
        "notes": len(data.notes),
        "unit": f"{data.meta['currency']} {data.meta['unit']}",
    }


SCENARIO = Scenario(
    name="financial_research",
    title="Financial research",
    description="Quarterly reports of three fictional companies: statements, segments, notes, "
                "ratios and growth.",
    system_prompt=read_prompt(__file__),
    tools=financial_tools(load_dataset),
    starter_questions=(
        "What was Northwind Robotics' revenue in 2024Q4?",
        "How did Cedar Grid Energy's gross margin change from 2023Q4 to 2024Q1, and why?",
        "Compare the net margin of NWR, CGE and LBH in 2024Q3.",
        "How much did Lumen Bay Health's revenue grow from 2023Q1 to 2024Q4?",
    ),
    summarize=_summary,
)
