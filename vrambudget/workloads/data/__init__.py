"""Data files the workloads read (the quality check's evaluation passages)."""
