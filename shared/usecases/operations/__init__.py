"""Operating the flow: operator actions, bulk jobs, the fleet, failures, reconciliation,
events and the pages that show it.
"""
