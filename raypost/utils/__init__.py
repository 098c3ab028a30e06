"""Logging, metrics, reports and cluster checks."""
