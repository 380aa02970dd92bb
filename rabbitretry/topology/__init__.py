"""Exchanges and queues as data: ``model``, TOML ``loader``, and ``apply`` (declare, plan,
verify, export) against a broker; ``delays`` is the shared delay chain and ``names`` the queue
names derived from a work queue's (both pure)."""

from rabbitretry.topology.apply import Plan, PlanEntry, declare, export_definitions, plan, verify
from rabbitretry.topology.loader import load_many, load_toml
from rabbitretry.topology.model import Binding, Exchange, Topology, WorkQueue

__all__ = [
    "Binding",
    "Exchange",
    "Plan",
    "PlanEntry",
    "Topology",
    "WorkQueue",
    "declare",
    "export_definitions",
    "load_many",
    "load_toml",
    "plan",
    "verify",
]
