"""Limits on the flow: the Agents' limiter, fairness between customers, and budgets."""
