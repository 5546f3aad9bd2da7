"""Sharing GPUs between teams: pools, quotas, admission order, fair share, preemption, "why pending".

`model` holds the vocabulary every part shares (pools and team quotas as the admin states them);
`engine` decides, from a snapshot of the store, which waiting jobs are admitted, which running
jobs are preempted, and why the others wait. It is pure (no database, no clock of its own), so the
dispatcher, the explain endpoint and the simulator give the same answers for the same inputs.
"""
