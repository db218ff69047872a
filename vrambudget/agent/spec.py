"""The probe agent's wire types. They live in the pure core (``vrambudget.core.probe_report``)
because the service compares the same reports; this module re-exports them for the agent."""

from vrambudget.core import probe_report
from vrambudget.core.probe_report import *  # noqa: F403 - the re-export is this module's purpose

__all__ = probe_report.__all__
