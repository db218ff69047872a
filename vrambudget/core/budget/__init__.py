"""Analytic budgets of model (inference, training) and generic workloads: per pipeline stage and
phase, the components of :mod:`vrambudget.core.formulas` combined into integers (``stage``,
``inference``, ``training``, ``generic``), the solver's numeric core and the explained answer
(``analytic``, ``explain``)."""
