"""Exchanges and queues as data: models, TOML loading, and applying them to a broker."""

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
