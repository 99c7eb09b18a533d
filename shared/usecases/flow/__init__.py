"""The order's flow: intake, the Scheduler, the Agents, the Supervisor, and the unit of
work they share.
"""
