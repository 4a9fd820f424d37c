"""financial_research: quarterly reports of fictional companies (data/, see generate_data.py)."""
