"""Generate the fictional companies' quarterly reports (run once; the output is committed).

    python -m scenarios.financial_research.generate_data

Everything is computed in integer units of USD 0.1 million, so the accounting identities
hold exactly after the values are written with one decimal:

- income: gross_profit = revenue - cost_of_revenue; operating_income = gross_profit - rnd - sga
  - other_charges; pretax_income = operating_income - interest_expense; net_income = pretax - tax
- cash flow: operating = net_income + depreciation - increase in working capital;
  investing = -capex - acquisitions; financing = debt_change - dividends;
  net_change_in_cash = operating + investing + financing; cash(t) = cash(t-1) + net change
- balance: total_assets = total_liabilities + shareholders_equity;
  equity(t) = equity(t-1) + net_income - dividends
- segments: segment revenue and operating income sum to the company totals.

The companies, their events and the notes are invented; no real data is involved.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
QUARTERS = [f"{year}Q{q}" for year in (2023, 2024) for q in (1, 2, 3, 4)]
TAX_RATE = 0.21


@dataclass
class Event:
    """Something that happened in one quarter, with its effect on the numbers and a note."""

    quarter: str
    topic: str
    note: str
    segment_revenue_factor: dict[str, float] = field(default_factory=dict)
    gross_margin_delta: float = 0.0
    other_charge: int = 0  # one-off operating charge, 0.1 M units
    acquisition: int = 0  # cash paid (0.1 M units), recorded as goodwill
    new_debt: int = 0  # long-term debt raised (0.1 M units)


@dataclass
class CompanySpec:
    ticker: str
    name: str
    sector: str
    description: str
    segments: dict[str, float]  # segment -> share of revenue in the first quarter
    segment_growth: dict[str, float]  # segment -> quarterly growth rate
    segment_margin: dict[str, float]  # relative operating-margin weight for allocation
    drivers: dict[str, str]  # segment -> what moved it (used in notes)
    revenue0: int
    seasonality: tuple[float, float, float, float]
    gross_margin: float
    rnd_ratio: float
    sga_ratio: float
    capex_ratio: float
    dividend: int
    shares_m: float
    interest_rate: float  # annual
    receivable_days: float  # receivables as a share of quarterly revenue
    inventory_ratio: float  # inventory as a share of quarterly cost of revenue
    payable_ratio: float  # payables as a share of quarterly cost of revenue
    opening: dict[str, int]
    events: list[Event]
    seed: int


COMPANIES = [
    CompanySpec(
        ticker="NWR",
        name="Northwind Robotics",
        sector="Industrial automation",
        description="Warehouse robots, service contracts and fleet software.",
        segments={"Warehouse Robots": 0.62, "Service Contracts": 0.23, "Fleet Software": 0.15},
        segment_growth={"Warehouse Robots": 0.025, "Service Contracts": 0.03, "Fleet Software": 0.065},
        segment_margin={"Warehouse Robots": 0.8, "Service Contracts": 1.2, "Fleet Software": 1.9},
        drivers={
            "Warehouse Robots": "orders from third-party logistics customers",
            "Service Contracts": "renewals of multi-year maintenance plans",
            "Fleet Software": "new subscriptions to the RouteMind planner",
        },
        revenue0=3820,
        seasonality=(0.96, 1.0, 0.98, 1.08),
        gross_margin=0.41,
        rnd_ratio=0.12,
        sga_ratio=0.17,
        capex_ratio=0.05,
        dividend=60,
        shares_m=84.0,
        interest_rate=0.055,
        receivable_days=0.62,
        inventory_ratio=0.9,
        payable_ratio=0.45,
        opening={"cash": 2150, "other_assets": 640, "ppe": 2380, "goodwill": 910,
                 "short_term_debt": 250, "long_term_debt": 1800, "other_liabilities": 520},
        events=[
            Event("2023Q3", "supply chain",
                  "A shortage of servo motors delayed shipments of the AX-40 robot; gross margin fell "
                  "as expedited freight was paid to keep key accounts supplied.",
                  segment_revenue_factor={"Warehouse Robots": 0.9}, gross_margin_delta=-0.035),
            Event("2024Q2", "acquisition",
                  "Acquired Kestrel Vision, a maker of machine-vision pick systems, for USD 64.0 M in "
                  "cash, financed with a USD 50.0 M term loan; the price is recorded as goodwill.",
                  acquisition=640, new_debt=500),
            Event("2024Q4", "outlook",
                  "Management raised the 2025 software target after RouteMind passed 1,200 paying "
                  "sites; robot backlog stood at 14 weeks.",
                  segment_revenue_factor={"Fleet Software": 1.06}),
        ],
        seed=11,
    ),
    CompanySpec(
        ticker="CGE",
        name="Cedar Grid Energy",
        sector="Energy storage",
        description="Utility-scale batteries, residential batteries and grid balancing services.",
        segments={"Utility Storage": 0.55, "Residential Batteries": 0.3, "Grid Services": 0.15},
        segment_growth={"Utility Storage": 0.04, "Residential Batteries": 0.01, "Grid Services": 0.05},
        segment_margin={"Utility Storage": 1.0, "Residential Batteries": 0.6, "Grid Services": 1.8},
        drivers={
            "Utility Storage": "commissioning of utility battery projects",
            "Residential Batteries": "installer demand for the HomeCell 10 battery",
            "Grid Services": "frequency-response contracts with grid operators",
        },
        revenue0=5210,
        seasonality=(0.92, 1.01, 1.1, 0.97),
        gross_margin=0.27,
        rnd_ratio=0.06,
        sga_ratio=0.1,
        capex_ratio=0.07,
        dividend=0,
        shares_m=152.0,
        interest_rate=0.062,
        receivable_days=0.7,
        inventory_ratio=1.1,
        payable_ratio=0.5,
        opening={"cash": 3400, "other_assets": 880, "ppe": 6100, "goodwill": 420,
                 "short_term_debt": 600, "long_term_debt": 4200, "other_liabilities": 900},
        events=[
            Event("2023Q4", "financing",
                  "Issued USD 80.0 M of green bonds due 2030 to fund the Ridgeway storage plant.",
                  new_debt=800),
            Event("2024Q1", "demand",
                  "Residential battery demand slumped after a cut in home-solar subsidies; the company "
                  "cut HomeCell prices, which lowered gross margin, and recorded a USD 12.0 M inventory "
                  "write-down in other charges.",
                  segment_revenue_factor={"Residential Batteries": 0.72}, gross_margin_delta=-0.02,
                  other_charge=120),
            Event("2024Q3", "project",
                  "The 400 MWh Ridgeway storage plant entered service, lifting utility storage revenue; "
                  "grid services won a two-year balancing contract.",
                  segment_revenue_factor={"Utility Storage": 1.12, "Grid Services": 1.08}),
        ],
        seed=23,
    ),
    CompanySpec(
        ticker="LBH",
        name="Lumen Bay Health",
        sector="Medical diagnostics",
        description="Lab diagnostics, imaging devices and a digital health platform.",
        segments={"Lab Diagnostics": 0.5, "Imaging Devices": 0.35, "Digital Health": 0.15},
        segment_growth={"Lab Diagnostics": 0.02, "Imaging Devices": 0.015, "Digital Health": 0.07},
        segment_margin={"Lab Diagnostics": 1.1, "Imaging Devices": 0.9, "Digital Health": 0.7},
        drivers={
            "Lab Diagnostics": "test volumes at hospital laboratories",
            "Imaging Devices": "placements of the ClearView ultrasound line",
            "Digital Health": "clinics adopting the CareLink remote-monitoring platform",
        },
        revenue0=2760,
        seasonality=(1.0, 0.98, 0.97, 1.05),
        gross_margin=0.58,
        rnd_ratio=0.15,
        sga_ratio=0.25,
        capex_ratio=0.04,
        dividend=45,
        shares_m=61.5,
        interest_rate=0.05,
        receivable_days=0.75,
        inventory_ratio=1.3,
        payable_ratio=0.4,
        opening={"cash": 1750, "other_assets": 520, "ppe": 1460, "goodwill": 1180,
                 "short_term_debt": 150, "long_term_debt": 1300, "other_liabilities": 610},
        events=[
            Event("2023Q4", "recall",
                  "Voluntary recall of ClearView C3 probes after a firmware fault; imaging revenue fell "
                  "and a USD 18.5 M warranty charge was booked in other charges.",
                  segment_revenue_factor={"Imaging Devices": 0.82}, other_charge=185),
            Event("2024Q1", "recovery",
                  "Corrected C3 probes shipped from February; imaging placements recovered to 90% of "
                  "the pre-recall run rate.",
                  segment_revenue_factor={"Imaging Devices": 0.93}),
            Event("2024Q3", "pricing",
                  "A 4% list-price increase on lab reagent kits took effect in July, lifting gross margin.",
                  segment_revenue_factor={"Lab Diagnostics": 1.04}, gross_margin_delta=0.015),
        ],
        seed=37,
    ),
]


def _split(total: int, weights: list[float]) -> list[int]:
    """Split an integer total by weights; the last part takes the rounding remainder."""
    weight_sum = sum(weights)
    parts = [round(total * w / weight_sum) for w in weights[:-1]]
    parts.append(total - sum(parts))
    return parts


def _to_m(value: int) -> float:
    return round(value / 10, 1)


def generate_company(spec: CompanySpec) -> tuple[dict, list[dict]]:
    """Return ({quarter: statements}, notes) for one company."""
    rng = random.Random(spec.seed)
    events = {e.quarter: e for e in spec.events}
    names = list(spec.segments)

    # Balances carried between quarters (0.1 M units).
    opening_cogs = spec.revenue0 * (1 - spec.gross_margin)
    state = dict(spec.opening)
    state["receivables"] = round(spec.revenue0 * spec.receivable_days)
    state["inventory"] = round(opening_cogs * spec.inventory_ratio)
    state["accounts_payable"] = round(opening_cogs * spec.payable_ratio)
    state["equity"] = (
        state["cash"] + state["receivables"] + state["inventory"] + state["ppe"] + state["goodwill"]
        + state["other_assets"]
        - state["accounts_payable"] - state["short_term_debt"] - state["long_term_debt"]
        - state["other_liabilities"]
    )

    statements: dict[str, dict] = {}
    notes: list[dict] = []
    previous_segment_revenue: dict[str, int] | None = None

    for t, quarter in enumerate(QUARTERS):
        event = events.get(quarter)
        season = spec.seasonality[t % 4]
        raw = []
        for name in names:
            value = spec.revenue0 * spec.segments[name] * (1 + spec.segment_growth[name]) ** t * season
            value *= 1 + rng.uniform(-0.015, 0.015)
            if event:
                value *= event.segment_revenue_factor.get(name, 1.0)
            raw.append(round(value))
        segment_revenue = dict(zip(names, raw))
        revenue = sum(raw)

        margin = spec.gross_margin + rng.uniform(-0.006, 0.006) + (event.gross_margin_delta if event else 0)
        cost_of_revenue = round(revenue * (1 - margin))
        gross_profit = revenue - cost_of_revenue
        rnd = round(revenue * spec.rnd_ratio * (1 + rng.uniform(-0.02, 0.02)))
        sga = round(revenue * spec.sga_ratio * (1 + rng.uniform(-0.02, 0.02)))
        other_charges = event.other_charge if event else 0
        operating_income = gross_profit - rnd - sga - other_charges

        new_debt = event.new_debt if event else 0
        long_term_debt = state["long_term_debt"] + new_debt
        interest_expense = round((state["short_term_debt"] + long_term_debt) * spec.interest_rate / 4)
        pretax_income = operating_income - interest_expense
        income_tax = round(max(pretax_income, 0) * TAX_RATE)
        net_income = pretax_income - income_tax

        depreciation = round(state["ppe"] * 0.025)
        capex = round(revenue * spec.capex_ratio)
        acquisitions = event.acquisition if event else 0
        receivables = round(revenue * spec.receivable_days)
        inventory = round(cost_of_revenue * spec.inventory_ratio)
        accounts_payable = round(cost_of_revenue * spec.payable_ratio)
        change_in_working_capital = -(
            (receivables - state["receivables"]) + (inventory - state["inventory"])
            - (accounts_payable - state["accounts_payable"])
        )
        operating_cash_flow = net_income + depreciation + change_in_working_capital
        investing_cash_flow = -capex - acquisitions
        dividends = spec.dividend
        financing_cash_flow = new_debt - dividends
        net_change_in_cash = operating_cash_flow + investing_cash_flow + financing_cash_flow

        cash = state["cash"] + net_change_in_cash
        ppe = state["ppe"] + capex - depreciation
        goodwill = state["goodwill"] + acquisitions
        equity = state["equity"] + net_income - dividends
        current_assets = cash + receivables + inventory
        total_assets = current_assets + ppe + goodwill + state["other_assets"]
        current_liabilities = accounts_payable + state["short_term_debt"]
        total_liabilities = current_liabilities + long_term_debt + state["other_liabilities"]
        if total_assets != total_liabilities + equity:
            raise AssertionError(f"{spec.ticker} {quarter}: balance sheet does not balance")
        if cash < 0:
            raise AssertionError(f"{spec.ticker} {quarter}: cash went negative")

        weights = [segment_revenue[n] * spec.segment_margin[n] for n in names]
        segment_income = dict(zip(names, _split(operating_income, weights)))

        statements[quarter] = {
            "income": {
                "revenue": _to_m(revenue),
                "cost_of_revenue": _to_m(cost_of_revenue),
                "gross_profit": _to_m(gross_profit),
                "rnd_expense": _to_m(rnd),
                "sga_expense": _to_m(sga),
                "other_charges": _to_m(other_charges),
                "operating_income": _to_m(operating_income),
                "interest_expense": _to_m(interest_expense),
                "pretax_income": _to_m(pretax_income),
                "income_tax": _to_m(income_tax),
                "net_income": _to_m(net_income),
                "eps": round(net_income / 10 / spec.shares_m, 2),
            },
            "balance": {
                "cash": _to_m(cash),
                "receivables": _to_m(receivables),
                "inventory": _to_m(inventory),
                "total_current_assets": _to_m(current_assets),
                "ppe_net": _to_m(ppe),
                "goodwill": _to_m(goodwill),
                "other_assets": _to_m(state["other_assets"]),
                "total_assets": _to_m(total_assets),
                "accounts_payable": _to_m(accounts_payable),
                "short_term_debt": _to_m(state["short_term_debt"]),
                "total_current_liabilities": _to_m(current_liabilities),
                "long_term_debt": _to_m(long_term_debt),
                "other_liabilities": _to_m(state["other_liabilities"]),
                "total_liabilities": _to_m(total_liabilities),
                "shareholders_equity": _to_m(equity),
            },
            "cash_flow": {
                "net_income": _to_m(net_income),
                "depreciation": _to_m(depreciation),
                "change_in_working_capital": _to_m(change_in_working_capital),
                "operating_cash_flow": _to_m(operating_cash_flow),
                "capex": _to_m(capex),
                "acquisitions": _to_m(acquisitions),
                "investing_cash_flow": _to_m(investing_cash_flow),
                "debt_issued": _to_m(new_debt),
                "dividends_paid": _to_m(dividends),
                "financing_cash_flow": _to_m(financing_cash_flow),
                "net_change_in_cash": _to_m(net_change_in_cash),
            },
            "segments": [
                {"segment": n, "revenue": _to_m(segment_revenue[n]),
                 "operating_income": _to_m(segment_income[n])}
                for n in names
            ],
        }

        notes.extend(_segment_notes(spec, quarter, segment_revenue, previous_segment_revenue))
        if event:
            notes.append({"company": spec.ticker, "quarter": quarter, "topic": event.topic,
                          "text": event.note})

        previous_segment_revenue = segment_revenue
        state.update(cash=cash, receivables=receivables, inventory=inventory,
                     accounts_payable=accounts_payable, ppe=ppe, goodwill=goodwill,
                     long_term_debt=long_term_debt, equity=equity)
    return statements, notes


def _segment_notes(spec: CompanySpec, quarter: str, revenue: dict[str, int],
                   previous: dict[str, int] | None) -> list[dict]:
    notes = []
    for name, value in revenue.items():
        if previous is None:
            text = f"{name} revenue was USD {_to_m(value)} M, driven by {spec.drivers[name]}."
        else:
            change = (value - previous[name]) / previous[name] * 100
            direction = "rose" if change >= 0 else "fell"
            text = (f"{name} revenue {direction} {abs(change):.1f}% from the prior quarter to "
                    f"USD {_to_m(value)} M, driven by {spec.drivers[name]}.")
        notes.append({"company": spec.ticker, "quarter": quarter, "topic": f"segment: {name}",
                      "text": text})
    return notes


def build() -> tuple[list[dict], dict, list[dict]]:
    """Return (companies, statements by ticker, notes); pure, deterministic."""
    companies, statements, notes = [], {}, []
    for spec in COMPANIES:
        companies.append({
            "ticker": spec.ticker, "name": spec.name, "sector": spec.sector,
            "description": spec.description, "segments": list(spec.segments),
            "shares_outstanding_m": spec.shares_m,
        })
        statements[spec.ticker], company_notes = generate_company(spec)
        notes.extend(company_notes)
    return companies, statements, notes


def main() -> None:
    companies, statements, notes = build()
    DATA_DIR.mkdir(exist_ok=True)
    meta = {"currency": "USD", "unit": "millions (eps in USD per share)", "quarters": QUARTERS}
    (DATA_DIR / "companies.json").write_text(
        json.dumps({"meta": meta, "companies": companies}, indent=1) + "\n")
    (DATA_DIR / "statements.json").write_text(json.dumps(statements, indent=1) + "\n")
    (DATA_DIR / "notes.json").write_text(json.dumps(notes, indent=1) + "\n")
    print(f"wrote {len(companies)} companies, {len(QUARTERS)} quarters, {len(notes)} notes to {DATA_DIR}")


if __name__ == "__main__":
    main()
