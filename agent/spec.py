"""The probe agent's wire types. They live in the pure core (``service.budget.probe_report``)
because the service compares the same reports; this module re-exports them for the agent."""

from service.budget import probe_report
from service.budget.probe_report import *  # noqa: F403 - the re-export is this module's purpose

__all__ = probe_report.__all__
